#pragma once
// TrackedCommunicator: forwards every call to another Communicator and
// counts the calls in flight, so a trainer can say whether it is waiting for
// peers (the coordinator's hang detector fences the member of a stalled job
// that is not waiting: docs/architecture.md, "Elasticity"); with an observer,
// also reports each call's kind, bytes and time (the worker's communication
// metrics).
//
// Thread-safety: as the wrapped communicator; the counter is atomic. Rebind
// only while no call is in flight (between generations).

#include <atomic>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace cohort::comm {

enum class Collective {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kSendRecv,
  kBarrier,
};
inline constexpr int kCollectiveKinds = 8;

// "allreduce", "reduce_scatter", ... (metric label values).
inline const char* CollectiveName(Collective c) {
  constexpr const char* kNames[kCollectiveKinds] = {
      "allreduce", "reduce_scatter", "allgather", "broadcast", "send", "recv", "sendrecv",
      "barrier"};
  return kNames[static_cast<int>(c)];
}

// Told about every call, successful or not, from the calling thread.
class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  // `bytes`: the call's full buffer (AllReduce and Broadcast: count; the
  // reduce-scatter input and the allgather output: count_per_rank x size;
  // point to point: the bytes sent plus received).
  virtual void Observe(Collective collective, size_t bytes, absl::Duration elapsed) = 0;
};

class TrackedCommunicator : public Communicator {
 public:
  // `inner`, `in_flight` and `observer` (may be null) must outlive this
  // object.
  TrackedCommunicator(Communicator* inner, std::atomic<int>* in_flight,
                      CollectiveObserver* observer = nullptr)
      : inner_(inner), in_flight_(in_flight), observer_(observer) {}

  // Forwards to `inner` from now on: a training session kept across
  // generations keeps its TrackedCommunicators (the model and the step
  // runner hold their addresses) and swaps what they wrap. `inner` must have
  // the same rank and size (InvalidArgument otherwise, nothing changed).
  absl::Status Rebind(Communicator* inner) {
    if (inner->rank() != inner_->rank() || inner->size() != inner_->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a kept communicator is rank ", inner_->rank(), " of ", inner_->size(),
          ", the new one rank ", inner->rank(), " of ", inner->size()));
    }
    inner_ = inner;
    return absl::OkStatus();
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Duration timeout) override {
    Scope scope(this, Collective::kAllReduce, count * DataTypeSize(type));
    return inner_->AllReduce(data, count, type, op, timeout);
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank, DataType type,
                             ReduceOp op, absl::Duration timeout) override {
    Scope scope(this, Collective::kReduceScatter,
                count_per_rank * DataTypeSize(type) * static_cast<size_t>(size()));
    return inner_->ReduceScatter(input, output, count_per_rank, type, op, timeout);
  }
  absl::Status ReduceScatterOrdered(const float* input, size_t count, size_t block, float* output,
                                    const std::vector<std::pair<int, int>>& merges,
                                    absl::Duration timeout) override {
    Scope scope(this, Collective::kReduceScatter, count * sizeof(float));
    return inner_->ReduceScatterOrdered(input, count, block, output, merges, timeout);
  }
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank, DataType type,
                         absl::Duration timeout) override {
    Scope scope(this, Collective::kAllGather,
                count_per_rank * DataTypeSize(type) * static_cast<size_t>(size()));
    return inner_->AllGather(input, output, count_per_rank, type, timeout);
  }
  absl::Status AllGatherRanges(void* data, const std::vector<ByteRange>& ranges, uint32_t tag,
                               absl::Duration timeout) override {
    size_t bytes = 0;
    for (const ByteRange& range : ranges) bytes += range.size();
    Scope scope(this, Collective::kAllGather, bytes);
    return inner_->AllGatherRanges(data, ranges, tag, timeout);
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Duration timeout) override {
    Scope scope(this, Collective::kBroadcast, count * DataTypeSize(type));
    return inner_->Broadcast(data, count, type, root, timeout);
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    Scope scope(this, Collective::kSend, bytes);
    return inner_->Send(data, bytes, peer, tag, timeout);
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    Scope scope(this, Collective::kRecv, bytes);
    return inner_->Recv(data, bytes, peer, tag, timeout);
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    Scope scope(this, Collective::kSendRecv, send_bytes + recv_bytes);
    return inner_->SendRecv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer,
                            tag, timeout);
  }
  absl::Status Barrier(absl::Duration timeout) override {
    Scope scope(this, Collective::kBarrier, 0);
    return inner_->Barrier(timeout);
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 private:
  struct Scope {
    Scope(TrackedCommunicator* owner, Collective collective, size_t bytes)
        : owner_(owner), collective_(collective), bytes_(bytes) {
      owner_->in_flight_->fetch_add(1);
      if (owner_->observer_ != nullptr) start_ = absl::Now();
    }
    ~Scope() {
      owner_->in_flight_->fetch_sub(1);
      if (owner_->observer_ != nullptr) {
        owner_->observer_->Observe(collective_, bytes_, absl::Now() - start_);
      }
    }
    TrackedCommunicator* const owner_;
    const Collective collective_;
    const size_t bytes_;
    absl::Time start_;
  };
  Communicator* inner_;
  std::atomic<int>* const in_flight_;
  CollectiveObserver* const observer_;
};

}  // namespace cohort::comm
