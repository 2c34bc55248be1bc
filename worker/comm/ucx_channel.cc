#include "worker/comm/ucx_channel.h"

#include <sched.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/comm/failed_peer.h"

namespace cohort::comm {
namespace {

// Empty polls in a row before the loop starts yielding the CPU: keeps
// latency low when data flows and lets oversubscribed ranks (more ranks than
// cores) make progress when it does not.
constexpr uint32_t kSpinsBeforeYield = 256;
// Check the clock every this many polls even while busy.
constexpr uint32_t kPollsPerClockCheck = 64;
// How long ReleaseAll waits for cancelled receives to settle.
constexpr absl::Duration kReleaseWait = absl::Milliseconds(20);

}  // namespace

UcxChannel::UcxChannel(UcxContext* context, uint16_t comm_id, std::vector<int> group, int index)
    : context_(context),
      worker_(context->worker()),
      comm_id_(comm_id),
      group_(std::move(group)),
      index_(index) {
  for (int i = kMaxRequests - 1; i >= 0; --i) free_[free_count_++] = i;
  // Without host identities (an explicit UCX_TLS) every label is empty and
  // the ring is the rank order.
  const int n = size();
  std::vector<std::string> hosts(static_cast<size_t>(n));
  for (int r = 0; r < n && context_ != nullptr; ++r) {
    hosts[static_cast<size_t>(r)] = context_->peer_host(group_[static_cast<size_t>(r)]);
  }
  ring_order_ = HostByHostRing(hosts);
  ring_position_.resize(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) ring_position_[static_cast<size_t>(ring_order_[static_cast<size_t>(p)])] = p;
}

void UcxChannel::BeginCall(absl::Duration timeout) {
  deadline_ = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  polls_ = 0;
  idle_polls_ = 0;
}

absl::StatusOr<UcxChannel::Handle> UcxChannel::Track(void* request, bool is_recv, size_t bytes,
                                                     int peer) {
  if (free_count_ == 0) {
    ucp_request_cancel(worker_, request);
    ucp_request_free(request);
    return absl::ResourceExhaustedError("ucx channel: out of request slots");
  }
  const int slot = free_[--free_count_];
  slots_[slot] = Slot{request, is_recv, bytes, peer};
  return slot;
}

absl::StatusOr<UcxChannel::Handle> UcxChannel::PostSend(int peer, uint64_t tag, const void* data,
                                                        size_t bytes) {
  const int world = group_[peer];
  if (context_->peer_dead(world)) {
    return WithFailedPeer(absl::UnavailableError(absl::StrCat("ucx: peer rank ", peer,
                                                              " (world rank ", world, ") is dead")),
                          world);
  }
  ucp_request_param_t param{};
  void* request = ucp_tag_send_nbx(context_->endpoint(world), data, bytes, tag, &param);
  if (request == nullptr) return kDone;
  if (UCS_PTR_IS_ERR(request)) {
    return WithFailedPeer(
        UcxStatusToStatus(UCS_PTR_STATUS(request), absl::StrCat("ucx send to rank ", peer)), world);
  }
  return Track(request, /*is_recv=*/false, bytes, peer);
}

absl::StatusOr<UcxChannel::Handle> UcxChannel::PostRecv(int peer, uint64_t tag, void* data,
                                                        size_t bytes) {
  // No dead-peer check here: a peer that sent its last message and exited
  // (its part of the call done) is fine, and the message may already wait in
  // UCX's queue. A receive from a dead peer that stays pending fails in Poll.
  // No immediate completion: the request reports the received length,
  // which Test() checks against `bytes`.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* request = ucp_tag_recv_nbx(worker_, data, bytes, tag, kFullTagMask, &param);
  if (request == nullptr) return kDone;
  if (UCS_PTR_IS_ERR(request)) {
    return WithFailedPeer(
        UcxStatusToStatus(UCS_PTR_STATUS(request), absl::StrCat("ucx recv from rank ", peer)),
        group_[peer]);
  }
  return Track(request, /*is_recv=*/true, bytes, peer);
}

absl::Status UcxChannel::CheckPeers() {
  const uint64_t epoch = context_->dead_epoch();
  if (epoch != seen_dead_epoch_) {
    seen_dead_epoch_ = epoch;
    group_has_dead_ = false;
    for (int world : group_) group_has_dead_ = group_has_dead_ || context_->peer_dead(world);
  }
  if (!group_has_dead_) return absl::OkStatus();
  // Only operations still waiting on a dead peer fail the call: peers leave
  // as soon as their own part of a call is done.
  for (const Slot& slot : slots_) {
    if (slot.request == nullptr || !context_->peer_dead(group_[slot.peer])) continue;
    if (ucp_request_check_status(slot.request) == UCS_INPROGRESS) {
      return WithFailedPeer(absl::UnavailableError(absl::StrCat(
                                "ucx: peer rank ", slot.peer, " (world rank ", group_[slot.peer],
                                ") failed")),
                            group_[slot.peer]);
    }
  }
  return absl::OkStatus();
}

absl::Status UcxChannel::Poll() {
  const unsigned events = ucp_worker_progress(worker_);
  if (aborted()) return AbortStatus();
  absl::Status peers = CheckPeers();
  if (!peers.ok()) return peers;
  ++polls_;
  if (events == 0) {
    ++idle_polls_;
    if (idle_polls_ >= kSpinsBeforeYield) sched_yield();
  } else {
    idle_polls_ = 0;
  }
  if (events == 0 || polls_ % kPollsPerClockCheck == 0) {
    // Same-host peers have no UCX failure handler: look at their processes.
    context_->CheckLocalPeers();
    if (absl::Now() > deadline_) return TimedOut("ucx");
  }
  return absl::OkStatus();
}

absl::Status UcxChannel::TimedOut(const char* transport) const {
  // Named after the first operation still waiting, for the log: in a ring
  // that peer may itself wait on another, so it is not blamed (no
  // FailedPeer); a cut shows as a connection failure at the next bootstrap.
  for (const Slot& slot : slots_) {
    if (slot.request == nullptr) continue;
    return absl::DeadlineExceededError(absl::StrCat(transport,
                                                    ": timed out waiting for peer rank ", slot.peer,
                                                    " (world rank ", group_[slot.peer], ")"));
  }
  return absl::DeadlineExceededError(absl::StrCat(transport, ": timed out waiting for peers"));
}

absl::Status UcxChannel::CheckWaiting(int peer) {
  if (aborted()) return AbortStatus();
  context_->CheckLocalPeers();
  if (context_->peer_dead(group_[peer])) {
    return WithFailedPeer(absl::UnavailableError(absl::StrCat("shm: peer rank ", peer,
                                                              " (world rank ", group_[peer],
                                                              ") failed")),
                          group_[peer]);
  }
  if (absl::Now() > deadline_) {
    // Not blamed: it may wait on another (see TimedOut).
    return absl::DeadlineExceededError(absl::StrCat("shm: timed out waiting for peer rank ", peer,
                                                    " (world rank ", group_[peer], ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> UcxChannel::Test(Handle* handle) {
  if (*handle == kDone) return true;
  Slot& slot = slots_[*handle];
  ucs_status_t status;
  ucp_tag_recv_info_t info{};
  if (slot.is_recv) {
    status = ucp_tag_recv_request_test(slot.request, &info);
  } else {
    status = ucp_request_check_status(slot.request);
  }
  if (status == UCS_INPROGRESS) return false;
  ucp_request_free(slot.request);
  const bool is_recv = slot.is_recv;
  const size_t bytes = slot.bytes;
  const int peer = slot.peer;
  slot = Slot{};
  free_[free_count_++] = *handle;
  *handle = kDone;
  if (status != UCS_OK) {
    if (context_->peer_dead(group_[peer])) {
      return WithFailedPeer(
          absl::UnavailableError(absl::StrCat("ucx: peer rank ", peer, " (world rank ",
                                              group_[peer], ") failed: ",
                                              ucs_status_string(status))),
          group_[peer]);
    }
    return WithFailedPeer(
        UcxStatusToStatus(status, absl::StrCat(is_recv ? "ucx recv from" : "ucx send to",
                                               " rank ", peer)),
        group_[peer]);
  }
  if (is_recv && info.length != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ucx recv: expected ", bytes, " bytes, got ", info.length));
  }
  return true;
}

absl::Status UcxChannel::Wait(Handle* handle) {
  while (true) {
    absl::StatusOr<bool> done = Test(handle);
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    absl::Status status = Poll();
    if (!status.ok()) return status;
  }
}

void UcxChannel::ReleaseAll() {
  bool any = false;
  for (Slot& slot : slots_) {
    if (slot.request == nullptr) continue;
    any = true;
    // Sends cannot be cancelled; an unmatched receive can, which keeps UCX
    // from writing into a buffer the caller is about to reuse.
    if (slot.is_recv) ucp_request_cancel(worker_, slot.request);
  }
  if (!any) return;
  const absl::Time until = absl::Now() + kReleaseWait;
  bool pending = true;
  while (pending && absl::Now() < until) {
    ucp_worker_progress(worker_);
    pending = false;
    for (const Slot& slot : slots_) {
      if (slot.request != nullptr && slot.is_recv &&
          ucp_request_check_status(slot.request) == UCS_INPROGRESS) {
        pending = true;
      }
    }
  }
  free_count_ = 0;
  for (int i = kMaxRequests - 1; i >= 0; --i) {
    if (slots_[i].request != nullptr) ucp_request_free(slots_[i].request);
    slots_[i] = Slot{};
    free_[free_count_++] = i;
  }
}

void UcxChannel::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_.load(std::memory_order_relaxed)) return;
  abort_reason_ = reason;
  aborted_.store(true, std::memory_order_release);
}

absl::Status UcxChannel::AbortStatus() const {
  absl::MutexLock lock(&mu_);
  return absl::AbortedError(absl::StrCat("communicator aborted: ", abort_reason_.ToString()));
}

}  // namespace cohort::comm
