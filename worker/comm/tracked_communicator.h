#pragma once
// TrackedCommunicator: forwards every call to another Communicator and
// counts the calls in flight, so a trainer can say whether it is waiting for
// peers (the coordinator's hang detector fences the member of a stalled job
// that is not waiting: docs/architecture.md, "Elasticity").
//
// Thread-safety: as the wrapped communicator; the counter is atomic.

#include <atomic>

#include "worker/comm/communicator.h"

namespace cohort::comm {

class TrackedCommunicator : public Communicator {
 public:
  // `inner` and `in_flight` must outlive this object.
  TrackedCommunicator(Communicator* inner, std::atomic<int>* in_flight)
      : inner_(inner), in_flight_(in_flight) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Duration timeout) override {
    Scope scope(in_flight_);
    return inner_->AllReduce(data, count, type, op, timeout);
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank, DataType type,
                             ReduceOp op, absl::Duration timeout) override {
    Scope scope(in_flight_);
    return inner_->ReduceScatter(input, output, count_per_rank, type, op, timeout);
  }
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank, DataType type,
                         absl::Duration timeout) override {
    Scope scope(in_flight_);
    return inner_->AllGather(input, output, count_per_rank, type, timeout);
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Duration timeout) override {
    Scope scope(in_flight_);
    return inner_->Broadcast(data, count, type, root, timeout);
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    Scope scope(in_flight_);
    return inner_->Send(data, bytes, peer, tag, timeout);
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    Scope scope(in_flight_);
    return inner_->Recv(data, bytes, peer, tag, timeout);
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    Scope scope(in_flight_);
    return inner_->SendRecv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer,
                            tag, timeout);
  }
  absl::Status Barrier(absl::Duration timeout) override {
    Scope scope(in_flight_);
    return inner_->Barrier(timeout);
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 private:
  struct Scope {
    explicit Scope(std::atomic<int>* counter) : counter_(counter) { counter_->fetch_add(1); }
    ~Scope() { counter_->fetch_sub(1); }
    std::atomic<int>* counter_;
  };
  Communicator* const inner_;
  std::atomic<int>* const in_flight_;
};

}  // namespace cohort::comm
