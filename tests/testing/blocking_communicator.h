#pragma once
// BlockingCommunicator: a Communicator that, once armed, blocks the next call
// of a chosen kind until Abort(), ignoring the call's timeout, as an NCCL
// kernel waiting on a dead peer does. Other calls go to `inner` (OK without
// one). For tests of what frees a survivor from such a call (the call
// watchdog, a Suspend).
//
// Thread-safe.

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/collective_observer.h"
#include "worker/comm/communicator.h"

namespace cohort::testing {

class BlockingCommunicator : public comm::Communicator {
 public:
  // `inner` (may be null: rank 0 of `size`) must outlive this.
  explicit BlockingCommunicator(comm::Communicator* inner, int size = 2)
      : inner_(inner), size_(size) {}

  // The next call of kind `which` (of any kind when nullopt) blocks until
  // Abort.
  void Arm(std::optional<comm::Collective> which = std::nullopt) {
    absl::MutexLock lock(&mu_);
    armed_ = true;
    which_ = which;
  }
  // Whether a call is blocked right now.
  bool blocked() const {
    absl::MutexLock lock(&mu_);
    return blocked_;
  }
  // The reason the last Abort gave (OK before any).
  absl::Status abort_reason() const {
    absl::MutexLock lock(&mu_);
    return abort_reason_;
  }

  int rank() const override { return inner_ != nullptr ? inner_->rank() : 0; }
  int size() const override { return inner_ != nullptr ? inner_->size() : size_; }
  absl::Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp op,
                         absl::Duration timeout) override {
    return Call(comm::Collective::kAllReduce, [&](comm::Communicator* c) {
      return c->AllReduce(data, count, type, op, timeout);
    });
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank,
                             comm::DataType type, comm::ReduceOp op,
                             absl::Duration timeout) override {
    return Call(comm::Collective::kReduceScatter, [&](comm::Communicator* c) {
      return c->ReduceScatter(input, output, count_per_rank, type, op, timeout);
    });
  }
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank,
                         comm::DataType type, absl::Duration timeout) override {
    return Call(comm::Collective::kAllGather, [&](comm::Communicator* c) {
      return c->AllGather(input, output, count_per_rank, type, timeout);
    });
  }
  absl::Status Broadcast(void* data, size_t count, comm::DataType type, int root,
                         absl::Duration timeout) override {
    return Call(comm::Collective::kBroadcast, [&](comm::Communicator* c) {
      return c->Broadcast(data, count, type, root, timeout);
    });
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return Call(comm::Collective::kSend,
                [&](comm::Communicator* c) { return c->Send(data, bytes, peer, tag, timeout); });
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return Call(comm::Collective::kRecv,
                [&](comm::Communicator* c) { return c->Recv(data, bytes, peer, tag, timeout); });
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    return Call(comm::Collective::kSendRecv, [&](comm::Communicator* c) {
      return c->SendRecv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer, tag,
                         timeout);
    });
  }
  absl::Status Barrier(absl::Duration timeout) override {
    return Call(comm::Collective::kBarrier,
                [&](comm::Communicator* c) { return c->Barrier(timeout); });
  }
  void Abort(const absl::Status& reason) override {
    {
      absl::MutexLock lock(&mu_);
      aborted_ = true;
      abort_reason_ = reason;
    }
    if (inner_ != nullptr) inner_->Abort(reason);
  }

 private:
  template <typename F>
  absl::Status Call(comm::Collective kind, F forward) {
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return Aborted();
      if (armed_ && (!which_.has_value() || *which_ == kind)) {
        armed_ = false;
        blocked_ = true;
        // No timeout: only Abort ends it.
        mu_.Await(absl::Condition(&aborted_));
        blocked_ = false;
        return Aborted();
      }
    }
    return inner_ != nullptr ? forward(inner_) : absl::OkStatus();
  }
  absl::Status Aborted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::AbortedError(absl::StrCat("communicator aborted: ", abort_reason_.message()));
  }

  comm::Communicator* const inner_;
  const int size_;
  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<comm::Collective> which_ ABSL_GUARDED_BY(mu_);
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::testing
