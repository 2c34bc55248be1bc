#pragma once
// TrackedCommunicator: forwards every call to another Communicator and
// counts the calls in flight, so a trainer can say whether it is waiting for
// peers (the coordinator's hang detector fences the member of a stalled job
// that is not waiting: docs/architecture.md, "Elasticity"); with an observer,
// also reports each call's kind, bytes and time (the worker's communication
// metrics); with a CallWatchdog (Watch), bounds each call by its timeout plus
// the watchdog's grace whatever the wrapped communicator does
// (call_watchdog.h).
//
// Thread-safety: as the wrapped communicator; the counter is atomic. Rebind
// and Watch only while no call is in flight (between generations).

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/call_watchdog.h"
#include "worker/comm/collective_observer.h"
#include "worker/comm/communicator.h"

namespace cohort::comm {

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
      return absl::InvalidArgumentError(absl::StrCat("a kept communicator is rank ", inner_->rank(),
                                                     " of ", inner_->size(), ", the new one rank ",
                                                     inner->rank(), " of ", inner->size()));
    }
    inner_ = inner;
    return absl::OkStatus();
  }

  // Every call from now on is watched by `watchdog` (null: none), which
  // names this communicator `group` and, when a call overruns, aborts
  // `domain` (may be null) with it. A call that fails once `domain` has
  // tripped (or that the watchdog aborted) returns the watchdog's
  // DeadlineExceeded instead of its Aborted.
  void Watch(CallWatchdog* watchdog, std::string group, AbortDomain* domain) {
    watchdog_ = watchdog;
    group_ = std::move(group);
    domain_ = domain;
  }
  // The domain an overrun aborts from now on (a kept session's communicators
  // move to the next generation).
  void set_abort_domain(AbortDomain* domain) { domain_ = domain; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kAllReduce, count * DataTypeSize(type));
    return scope.Done(inner_->AllReduce(data, count, type, op, timeout));
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank, DataType type,
                             ReduceOp op, absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kReduceScatter,
                count_per_rank * DataTypeSize(type) * static_cast<size_t>(size()));
    return scope.Done(inner_->ReduceScatter(input, output, count_per_rank, type, op, timeout));
  }
  absl::Status ReduceScatterOrdered(const float* input, size_t count, size_t block, float* output,
                                    const std::vector<std::pair<int, int>>& merges,
                                    absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kReduceScatter, count * sizeof(float));
    return scope.Done(inner_->ReduceScatterOrdered(input, count, block, output, merges, timeout));
  }
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank, DataType type,
                         absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kAllGather,
                count_per_rank * DataTypeSize(type) * static_cast<size_t>(size()));
    return scope.Done(inner_->AllGather(input, output, count_per_rank, type, timeout));
  }
  absl::Status AllGatherRanges(void* data, const std::vector<ByteRange>& ranges, uint32_t tag,
                               absl::Duration timeout) override {
    size_t bytes = 0;
    for (const ByteRange& range : ranges) bytes += range.size();
    Scope scope(this, timeout, Collective::kAllGather, bytes);
    return scope.Done(inner_->AllGatherRanges(data, ranges, tag, timeout));
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kBroadcast, count * DataTypeSize(type));
    return scope.Done(inner_->Broadcast(data, count, type, root, timeout));
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kSend, bytes);
    return scope.Done(inner_->Send(data, bytes, peer, tag, timeout));
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kRecv, bytes);
    return scope.Done(inner_->Recv(data, bytes, peer, tag, timeout));
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kSendRecv, send_bytes + recv_bytes);
    return scope.Done(inner_->SendRecv(send_data, send_bytes, send_peer, recv_data, recv_bytes,
                                       recv_peer, tag, timeout));
  }
  absl::Status Barrier(absl::Duration timeout) override {
    Scope scope(this, timeout, Collective::kBarrier, 0);
    return scope.Done(inner_->Barrier(timeout));
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 private:
  struct Scope {
    Scope(TrackedCommunicator* owner, absl::Duration timeout, Collective collective, size_t bytes)
        : owner_(owner), collective_(collective), bytes_(bytes) {
      owner_->in_flight_->fetch_add(1);
      if (owner_->observer_ != nullptr) start_ = absl::Now();
      if (owner_->watchdog_ != nullptr) {
        watch_.emplace(owner_->watchdog_, owner_->group_, collective, timeout, owner_->inner_,
                       owner_->domain_, owner_->observer_);
      }
    }
    ~Scope() {
      watch_.reset();
      owner_->in_flight_->fetch_sub(1);
      if (owner_->observer_ != nullptr) {
        owner_->observer_->Observe(collective_, bytes_, absl::Now() - start_);
      }
    }
    // The call's result, or the watchdog's reason where the call failed
    // because the watchdog aborted it or its generation.
    absl::Status Done(absl::Status status) const {
      if (status.ok() || !watch_.has_value()) return status;
      if (absl::Status aborted = watch_->aborted(); !aborted.ok()) return aborted;
      if (owner_->domain_ != nullptr) {
        if (absl::Status tripped = owner_->domain_->tripped(); !tripped.ok()) return tripped;
      }
      return status;
    }
    TrackedCommunicator* const owner_;
    const Collective collective_;
    const size_t bytes_;
    absl::Time start_;
    std::optional<CallWatchdog::Watch> watch_;
  };
  Communicator* inner_;
  std::atomic<int>* const in_flight_;
  CollectiveObserver* const observer_;
  CallWatchdog* watchdog_ = nullptr;
  std::string group_;
  AbortDomain* domain_ = nullptr;
};

}  // namespace cohort::comm
