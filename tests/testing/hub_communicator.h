#pragma once
// Hub and HubCommunicator: point-to-point messages between threads of one
// test process, behind the Communicator interface (Send never blocks, Recv
// waits for its timeout, at most 20 s), and AllGather over them; the other collectives are not
// implemented. For unit tests of code
// that exchanges state between ranks (peer recovery, optimizer mirrors).

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace cohort::testing {

// Point-to-point messages in memory: Send never blocks, Recv waits.
class Hub {
 public:
  void Post(int from, int to, uint32_t tag, const void* data, size_t bytes) {
    absl::MutexLock lock(&mu_);
    boxes_[{from, to, tag}].emplace_back(static_cast<const char*>(data),
                                         static_cast<const char*>(data) + bytes);
  }
  absl::Status Take(int from, int to, uint32_t tag, void* data, size_t bytes,
                    absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    const auto key = std::make_tuple(from, to, tag);
    auto ready = [&] { return !boxes_[key].empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), std::min(timeout, absl::Seconds(20)))) {
      return absl::DeadlineExceededError("no message");
    }
    std::vector<char> message = std::move(boxes_[key].front());
    boxes_[key].pop_front();
    if (message.size() != bytes) return absl::InvalidArgumentError("size mismatch");
    std::memcpy(data, message.data(), bytes);
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  std::map<std::tuple<int, int, uint32_t>, std::deque<std::vector<char>>> boxes_
      ABSL_GUARDED_BY(mu_);
};

class HubCommunicator : public comm::Communicator {
 public:
  HubCommunicator(Hub* hub, int rank, int size) : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduce(void*, size_t, comm::DataType, comm::ReduceOp, absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status ReduceScatter(const void*, void*, size_t, comm::DataType, comm::ReduceOp,
                             absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  // Every rank's part, through the hub: posted to every other rank, taken
  // from each (in order: each pair's messages of one tag are FIFO).
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank,
                         comm::DataType type, absl::Duration timeout) override {
    constexpr uint32_t kAllGatherTag = 0x616c6c67;  // "allg"
    const size_t bytes = count_per_rank * comm::DataTypeSize(type);
    char* out = static_cast<char*>(output);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) hub_->Post(rank_, peer, kAllGatherTag, input, bytes);
    }
    std::memcpy(out + static_cast<size_t>(rank_) * bytes, input, bytes);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      absl::Status taken = hub_->Take(peer, rank_, kAllGatherTag,
                                      out + static_cast<size_t>(peer) * bytes, bytes, timeout);
      if (!taken.ok()) return taken;
    }
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, size_t, comm::DataType, int, absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration) override {
    hub_->Post(rank_, peer, tag, data, bytes);
    return absl::OkStatus();
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return hub_->Take(peer, rank_, tag, data, bytes, timeout);
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    hub_->Post(rank_, send_peer, tag, send_data, send_bytes);
    return hub_->Take(recv_peer, rank_, tag, recv_data, recv_bytes, timeout);
  }
  absl::Status Barrier(absl::Duration) override { return absl::OkStatus(); }
  void Abort(const absl::Status&) override {}

 private:
  Hub* hub_;
  int rank_, size_;
};

}  // namespace cohort::testing
