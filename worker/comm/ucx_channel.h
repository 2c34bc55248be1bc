#pragma once
// UcxChannel: the messaging engine under one UcxCommunicator, and the
// production Channel (channel.h). It posts tagged sends and receives to
// group peers over the shared UcxContext, tracks them in a fixed table of
// request slots (no allocation per call), and drives progress while
// checking, on every poll, the abort flag, the call's deadline and whether a
// group peer died. The algorithms in ring_algorithms.h run on it through the
// Channel interface; the communicator and the direct reads call it as the
// concrete (final) type, so their calls stay direct.
//
// Thread-safety: one call at a time (the communicator's contract); Abort()
// and aborted() may be called from any thread at any time.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/channel.h"
#include "worker/comm/ucx_context.h"
#include "worker/comm/ucx_tags.h"

namespace cohort::comm {

class UcxChannel final : public Channel {
 public:
  // `group` lists world ranks in group-rank order; `index` is this
  // process's position in it.
  UcxChannel(UcxContext* context, uint16_t comm_id, std::vector<int> group, int index);

  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(group_.size()); }
  // The ring the ring algorithms run on: group ranks grouped host by host
  // (HostByHostRing over the host identities the ranks published), so a
  // ring crosses each host boundary once in each direction however the mesh
  // numbered them. The identity on one host.
  int ring_position() const override { return ring_position_[static_cast<size_t>(index_)]; }
  // The group rank at ring position `position` (taken modulo size()).
  int ring_rank(int position) const override {
    const int n = size();
    return ring_order_[static_cast<size_t>(((position % n) + n) % n)];
  }
  uint16_t comm_id() const { return comm_id_; }

  // Starts a call: every Poll() after this fails with DeadlineExceeded once
  // `timeout` has passed.
  void BeginCall(absl::Duration timeout);
  // Advances the collective sequence number carried in collective tags.
  void NextSequence() { ++sequence_; }

  uint64_t CollectiveTag(int source, uint32_t message) const override {
    return MakeTag(comm_id_, TagKind::kCollective, source, CollectiveLow(sequence_, message));
  }
  uint64_t PointToPointTag(int source, uint32_t user_tag) const {
    return MakeTag(comm_id_, TagKind::kPointToPoint, source, user_tag);
  }
  uint64_t DirectReadAnswerTag(int source, uint32_t user_tag) const {
    return MakeTag(comm_id_, TagKind::kDirectReadAnswer, source, user_tag);
  }
  // The world rank of group rank `peer`.
  int world_rank(int peer) const { return group_[static_cast<size_t>(peer)]; }
  UcxContext* context() const { return context_; }

  // As Channel.
  absl::StatusOr<Handle> PostSend(int peer, uint64_t tag, const void* data,
                                  size_t bytes) override;
  absl::StatusOr<Handle> PostRecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  absl::Status Poll() override;
  // For waits on group rank `peer` outside UCX (the shared-memory
  // collectives): abort, that peer's death, the deadline. Same errors as
  // Poll().
  absl::Status CheckWaiting(int peer);
  absl::StatusOr<bool> Test(Handle* handle) override;
  absl::Status Wait(Handle* handle) override;
  // Cancels outstanding receives, waits briefly for them to settle, and
  // frees every outstanding request.
  void ReleaseAll() override;

  void Abort(const absl::Status& reason);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Aborted, with the reason given to Abort().
  absl::Status AbortStatus() const;

 private:
  struct Slot {
    void* request = nullptr;
    bool is_recv = false;
    size_t bytes = 0;
    int peer = 0;
  };

  absl::StatusOr<Handle> Track(void* request, bool is_recv, size_t bytes, int peer);
  absl::Status CheckPeers();
  // DeadlineExceeded naming the peer the first pending operation waits on.
  absl::Status TimedOut(const char* transport) const;

  UcxContext* const context_;
  ucp_worker_h const worker_;
  const uint16_t comm_id_;
  const std::vector<int> group_;
  std::vector<int> ring_order_;     // position -> group rank
  std::vector<int> ring_position_;  // group rank -> position
  const int index_;

  uint32_t sequence_ = 0;
  absl::Time deadline_ = absl::InfiniteFuture();
  uint64_t seen_dead_epoch_ = 0;
  bool group_has_dead_ = false;
  uint32_t polls_ = 0;
  uint32_t idle_polls_ = 0;

  std::array<Slot, kMaxRequests> slots_{};
  std::array<int, kMaxRequests> free_{};
  int free_count_ = 0;

  std::atomic<bool> aborted_{false};
  mutable absl::Mutex mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::comm
