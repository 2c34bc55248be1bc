#pragma once
// InMemoryFabric and InMemoryChannel: the Channel seam (channel.h) for ranks
// that are threads of one process, so the collective algorithms, and
// everything built on a Communicator over them (InMemoryCommunicator), can
// be tested in process, fast, and on their error paths.
//
// Matching is UCX's: a receive takes the first message of its peer with its
// exact tag, in the order sent, and completes with InvalidArgument if the
// message has another length. Messages move by rendezvous: a send stays
// outstanding until a receive matches it, and the bytes are copied from the
// sender's buffer at that moment, under the fabric's lock. That is the
// strictest reading of the Channel contract (a buffer belongs to the
// transport until its handle completes), so an algorithm that reuses a send
// buffer early, or needs a send to complete before its peer posts the
// receive, shows here. Nothing progresses in the background: a match
// completes both requests at once, so Poll only checks and, while one of
// the rank's requests is pending, waits (on a condition variable, until
// the fabric changes, the call's deadline passes or the channel is
// aborted): ranks that wait cost no CPU.
//
// Failures, for tests of the error paths: Fail(rank) makes a rank dead as a
// killed process is: its unmatched requests vanish, a send to it fails with
// Unavailable at once, and a peer's request still waiting on it fails the
// peer's next Poll with Unavailable (naming it, WithFailedPeer); the dead
// rank's own later calls fail with Unavailable too, so its thread returns.
// FailAfterSends makes a rank die in the middle of a collective, at a
// chosen message. A rank that never arrives shows as DeadlineExceeded at
// the call's deadline; Abort as Aborted.
//
// Thread-safety: InMemoryFabric is thread-safe. An InMemoryChannel is used
// by one thread at a time (one call at a time, as any Channel); Abort(),
// aborted() and the fabric's failure injection may be called from any
// thread at any time.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/channel.h"

namespace cohort::comm {

class InMemoryChannel;

class InMemoryFabric {
 public:
  // `size` ranks; `hosts`, when given, names each rank's host (size()
  // labels), which sets the ring as on UCX (HostByHostRing); empty: one host,
  // the ring is the rank order.
  explicit InMemoryFabric(int size, std::vector<std::string> hosts = {});
  InMemoryFabric(const InMemoryFabric&) = delete;
  InMemoryFabric& operator=(const InMemoryFabric&) = delete;

  int size() const { return size_; }
  // Position -> rank, shared by every channel of the fabric.
  const std::vector<int>& ring_order() const { return ring_order_; }

  // Makes `rank` dead now (see above). Idempotent.
  void Fail(int rank);
  // Makes `rank` dead as it posts its `sends`-th send from now on (1: the
  // next one), which then fails, as does everything after it.
  void FailAfterSends(int rank, int sends);
  bool failed(int rank) const;

 private:
  friend class InMemoryChannel;

  struct Request {
    bool in_use = false;
    bool is_recv = false;
    bool done = false;
    absl::Status status;  // of a done request
    int peer = 0;
    uint64_t tag = 0;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t bytes = 0;
  };
  // A request of rank `rank`, in the slot `slot` of its table.
  struct RequestId {
    int rank = 0;
    int slot = 0;
  };
  struct RankState {
    std::array<Request, Channel::kMaxRequests> requests;
    std::vector<int> free;
    // Unmatched, in the order posted: this rank's receives, and the sends
    // addressed to it.
    std::deque<int> recvs;
    std::deque<RequestId> sends_to;
    bool attached = false;
    bool failed = false;
    int sends_until_failure = -1;  // -1: no failure planned
    bool aborted = false;
    absl::Status abort_reason;
  };

  // The channel's side (InMemoryChannel forwards here).
  void Attach(int rank);
  void Detach(int rank);
  absl::StatusOr<Channel::Handle> PostSend(int rank, int peer, uint64_t tag, const void* data,
                                           size_t bytes);
  absl::StatusOr<Channel::Handle> PostRecv(int rank, int peer, uint64_t tag, void* data,
                                           size_t bytes);
  // Returns at once when none of the rank's requests is pending, else once
  // the fabric changed since *seen_events (updating it); or with the first
  // error: Aborted, Unavailable (this rank, or a peer one of its requests
  // waits on, failed), DeadlineExceeded.
  absl::Status Poll(int rank, absl::Time deadline, uint64_t* seen_events);
  absl::StatusOr<bool> Test(int rank, Channel::Handle* handle);
  void ReleaseAll(int rank);
  void Abort(int rank, const absl::Status& reason);
  bool aborted(int rank) const;
  absl::Status AbortStatus(int rank) const;

  // Aborted or Unavailable when `rank` can no longer communicate.
  absl::Status CheckRank(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AbortedLocked(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Channel::Handle> Allocate(int rank, Request request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies a matched send's bytes into `recv` and completes it
  // (InvalidArgument when the lengths differ).
  static void Deliver(const void* data, size_t bytes, Request& recv);
  void MarkFailed(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops rank `rank`'s request `slot` from the unmatched queues.
  void Unqueue(int rank, int slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int size_;
  const std::vector<int> ring_order_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
};

// One rank's Channel on a fabric; at most one per rank at a time. The
// fabric must outlive it.
class InMemoryChannel final : public Channel {
 public:
  InMemoryChannel(InMemoryFabric* fabric, int rank);
  ~InMemoryChannel() override;
  InMemoryChannel(const InMemoryChannel&) = delete;
  InMemoryChannel& operator=(const InMemoryChannel&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }
  int ring_position() const override { return ring_position_; }
  int ring_rank(int position) const override {
    const int n = size();
    return fabric_->ring_order()[static_cast<size_t>(((position % n) + n) % n)];
  }
  // The layout of UCX's tags (ucx_tags.h), for the same sequence numbers;
  // the sender is matched apart, as UCX matches it in the tag.
  uint64_t CollectiveTag(int source, uint32_t message) const override;
  uint64_t PointToPointTag(int source, uint32_t user_tag) const;

  absl::StatusOr<Handle> PostSend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  absl::StatusOr<Handle> PostRecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  absl::Status Poll() override;
  absl::StatusOr<bool> Test(Handle* handle) override;
  absl::Status Wait(Handle* handle) override;
  void ReleaseAll() override;

  // As UcxChannel: every Poll() after this fails with DeadlineExceeded once
  // `timeout` has passed; NextSequence advances the collective tags.
  void BeginCall(absl::Duration timeout);
  void NextSequence() { ++sequence_; }
  void Abort(const absl::Status& reason) { fabric_->Abort(rank_, reason); }
  bool aborted() const { return fabric_->aborted(rank_); }
  // Aborted, with the reason given to Abort().
  absl::Status AbortStatus() const { return fabric_->AbortStatus(rank_); }

 private:
  InMemoryFabric* const fabric_;
  const int rank_;
  int ring_position_ = 0;
  uint32_t sequence_ = 0;
  absl::Time deadline_ = absl::InfiniteFuture();
  uint64_t seen_events_ = 0;
};

}  // namespace cohort::comm
