#pragma once
// TimedCommunicator: a Communicator that forwards every call to another and
// adds up the wall time spent inside them, so a benchmark can report the
// share of a training step spent communicating (or waiting for peers) per
// mesh axis.
//
// Thread-safety: as the wrapped communicator; elapsed() is read between calls.

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace cohort::bench {

class TimedCommunicator : public comm::Communicator {
 public:
  explicit TimedCommunicator(comm::Communicator* inner) : inner_(inner) {}

  absl::Duration elapsed() const { return elapsed_; }
  void Reset() { elapsed_ = absl::ZeroDuration(); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp op,
                         absl::Duration timeout) override {
    return Timed([&] { return inner_->AllReduce(data, count, type, op, timeout); });
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count, comm::DataType type,
                             comm::ReduceOp op, absl::Duration timeout) override {
    return Timed([&] { return inner_->ReduceScatter(input, output, count, type, op, timeout); });
  }
  absl::Status AllGather(const void* input, void* output, size_t count, comm::DataType type,
                         absl::Duration timeout) override {
    return Timed([&] { return inner_->AllGather(input, output, count, type, timeout); });
  }
  absl::Status Broadcast(void* data, size_t count, comm::DataType type, int root,
                         absl::Duration timeout) override {
    return Timed([&] { return inner_->Broadcast(data, count, type, root, timeout); });
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return Timed([&] { return inner_->Send(data, bytes, peer, tag, timeout); });
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return Timed([&] { return inner_->Recv(data, bytes, peer, tag, timeout); });
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
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
  template <typename F>
  absl::Status Timed(F&& call) {
    const absl::Time start = absl::Now();
    absl::Status status = call();
    elapsed_ += absl::Now() - start;
    return status;
  }

  comm::Communicator* const inner_;
  absl::Duration elapsed_;
};

}  // namespace cohort::bench
