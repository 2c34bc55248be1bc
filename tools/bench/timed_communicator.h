#pragma once
// TimedCommunicator: a Communicator that forwards every call to another and
// adds up the wall time spent inside them, so a benchmark can report the
// share of a training step spent communicating (or waiting for peers) per
// mesh axis, and the bytes this rank sends: what it hands to point-to-point
// calls, and for collectives what the bandwidth-optimal (ring) algorithms
// send, (n - 1) / n of the data per reduce-scatter or all-gather pass.
//
// Thread-safety: as the wrapped communicator; elapsed() is read between calls.

#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace cohort::bench {

class TimedCommunicator : public comm::Communicator {
 public:
  explicit TimedCommunicator(comm::Communicator* inner) : inner_(inner) {}

  absl::Duration elapsed() const { return elapsed_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  void Reset() {
    elapsed_ = absl::ZeroDuration();
    bytes_sent_ = 0;
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp op,
                         absl::Duration timeout) override {
    CountPasses(2, count * comm::DataTypeSize(type));
    return Timed([&] { return inner_->AllReduce(data, count, type, op, timeout); });
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count, comm::DataType type,
                             comm::ReduceOp op, absl::Duration timeout) override {
    CountPasses(1, count * comm::DataTypeSize(type) * static_cast<size_t>(size()));
    return Timed([&] { return inner_->ReduceScatter(input, output, count, type, op, timeout); });
  }
  absl::Status ReduceScatterOrdered(const float* input, size_t count, size_t block, float* output,
                                    const std::vector<std::pair<int, int>>& merges,
                                    absl::Duration timeout) override {
    absl::Status status = Timed([&] {
      return inner_->ReduceScatterOrdered(input, count, block, output, merges, timeout);
    });
    // Counted only when it ran (Unimplemented: the caller exchanges the
    // blocks point to point, which counts itself).
    if (!absl::IsUnimplemented(status)) CountPasses(1, count * sizeof(float));
    return status;
  }
  absl::Status AllGather(const void* input, void* output, size_t count, comm::DataType type,
                         absl::Duration timeout) override {
    CountPasses(1, count * comm::DataTypeSize(type) * static_cast<size_t>(size()));
    return Timed([&] { return inner_->AllGather(input, output, count, type, timeout); });
  }
  absl::Status Broadcast(void* data, size_t count, comm::DataType type, int root,
                         absl::Duration timeout) override {
    return Timed([&] { return inner_->Broadcast(data, count, type, root, timeout); });
  }
  absl::Status AllGatherRanges(void* data, const std::vector<comm::ByteRange>& ranges,
                               uint32_t tag, absl::Duration timeout) override {
    // Its own range goes to every peer, however it travels.
    const size_t own = static_cast<size_t>(rank()) < ranges.size() ? ranges[rank()].size() : 0;
    bytes_sent_ += static_cast<uint64_t>(own) * static_cast<uint64_t>(size() - 1);
    return Timed([&] { return inner_->AllGatherRanges(data, ranges, tag, timeout); });
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    bytes_sent_ += bytes;
    return Timed([&] { return inner_->Send(data, bytes, peer, tag, timeout); });
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return Timed([&] { return inner_->Recv(data, bytes, peer, tag, timeout); });
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    bytes_sent_ += send_bytes;
    return Timed([&] {
      return inner_->SendRecv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer,
                              tag, timeout);
    });
  }
  absl::Status Barrier(absl::Duration timeout) override {
    return Timed([&] { return inner_->Barrier(timeout); });
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 private:
  // `passes` reduce-scatter or all-gather passes over `bytes` of data.
  void CountPasses(int passes, size_t bytes) {
    const size_t n = static_cast<size_t>(size());
    if (n > 1) bytes_sent_ += static_cast<uint64_t>(passes) * bytes * (n - 1) / n;
  }

  template <typename F>
  absl::Status Timed(F&& call) {
    const absl::Time start = absl::Now();
    absl::Status status = call();
    elapsed_ += absl::Now() - start;
    return status;
  }

  comm::Communicator* const inner_;
  absl::Duration elapsed_;
  uint64_t bytes_sent_ = 0;
};

}  // namespace cohort::bench
