#include "worker/comm/in_memory_channel.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "worker/comm/failed_peer.h"
#include "worker/comm/ucx_tags.h"

namespace cohort::comm {
namespace {

std::vector<int> RingOf(int size, const std::vector<std::string>& hosts) {
  if (hosts.empty()) {
    std::vector<int> ring(static_cast<size_t>(size));
    std::iota(ring.begin(), ring.end(), 0);
    return ring;
  }
  CHECK(hosts.size() == static_cast<size_t>(size)) << "one host label per rank";
  return HostByHostRing(hosts);
}

absl::Status PeerFailed(int peer) {
  return WithFailedPeer(
      absl::UnavailableError(absl::StrCat("in-memory: peer rank ", peer, " failed")), peer);
}

}  // namespace

InMemoryFabric::InMemoryFabric(int size, std::vector<std::string> hosts)
    : size_(size), ring_order_(RingOf(size, hosts)) {
  CHECK(size >= 1) << "an empty fabric";
  absl::MutexLock lock(&mu_);
  ranks_.resize(static_cast<size_t>(size));
  for (RankState& state : ranks_) {
    for (int i = Channel::kMaxRequests - 1; i >= 0; --i) state.free.push_back(i);
  }
}

void InMemoryFabric::Fail(int rank) {
  absl::MutexLock lock(&mu_);
  MarkFailed(rank);
}

void InMemoryFabric::FailAfterSends(int rank, int sends) {
  CHECK(sends >= 1) << "FailAfterSends: " << sends;
  absl::MutexLock lock(&mu_);
  ranks_[static_cast<size_t>(rank)].sends_until_failure = sends;
}

bool InMemoryFabric::failed(int rank) const {
  absl::MutexLock lock(&mu_);
  return ranks_[static_cast<size_t>(rank)].failed;
}

void InMemoryFabric::Attach(int rank) {
  CHECK(rank >= 0 && rank < size_) << "rank " << rank << " of " << size_;
  absl::MutexLock lock(&mu_);
  RankState& state = ranks_[static_cast<size_t>(rank)];
  CHECK(!state.attached) << "rank " << rank << " already has a channel";
  state.attached = true;
}

void InMemoryFabric::Detach(int rank) {
  ReleaseAll(rank);
  absl::MutexLock lock(&mu_);
  ranks_[static_cast<size_t>(rank)].attached = false;
}

absl::Status InMemoryFabric::AbortedLocked(int rank) const {
  return absl::AbortedError(absl::StrCat(
      "communicator aborted: ", ranks_[static_cast<size_t>(rank)].abort_reason.ToString()));
}

absl::Status InMemoryFabric::CheckRank(int rank) const {
  const RankState& state = ranks_[static_cast<size_t>(rank)];
  if (state.aborted) return AbortedLocked(rank);
  if (state.failed) {
    return absl::UnavailableError(absl::StrCat("in-memory: rank ", rank, " failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Channel::Handle> InMemoryFabric::Allocate(int rank, Request request) {
  RankState& state = ranks_[static_cast<size_t>(rank)];
  if (state.free.empty()) {
    return absl::ResourceExhaustedError("in-memory channel: out of request slots");
  }
  const int slot = state.free.back();
  state.free.pop_back();
  request.in_use = true;
  state.requests[static_cast<size_t>(slot)] = std::move(request);
  return slot;
}

void InMemoryFabric::Deliver(const void* data, size_t bytes, Request& recv) {
  if (bytes == recv.bytes) {
    if (bytes > 0) std::memcpy(recv.recv, data, bytes);
  } else {
    recv.status = absl::InvalidArgumentError(
        absl::StrCat("in-memory recv: expected ", recv.bytes, " bytes, got ", bytes));
  }
  recv.done = true;
}

absl::StatusOr<Channel::Handle> InMemoryFabric::PostSend(int rank, int peer, uint64_t tag,
                                                         const void* data, size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRank(rank); !s.ok()) return s;
  RankState& state = ranks_[static_cast<size_t>(rank)];
  if (state.sends_until_failure > 0 && --state.sends_until_failure == 0) {
    MarkFailed(rank);
    return absl::UnavailableError(absl::StrCat("in-memory: rank ", rank, " failed (injected)"));
  }
  RankState& receiver = ranks_[static_cast<size_t>(peer)];
  if (receiver.failed) return PeerFailed(peer);
  for (auto it = receiver.recvs.begin(); it != receiver.recvs.end(); ++it) {
    Request& recv = receiver.requests[static_cast<size_t>(*it)];
    if (recv.peer != rank || recv.tag != tag) continue;
    Deliver(data, bytes, recv);
    receiver.recvs.erase(it);
    Changed();
    return Channel::kDone;
  }
  Request send;
  send.peer = peer;
  send.tag = tag;
  send.send = data;
  send.bytes = bytes;
  absl::StatusOr<Channel::Handle> handle = Allocate(rank, std::move(send));
  if (handle.ok()) receiver.sends_to.push_back(RequestId{rank, *handle});
  return handle;
}

absl::StatusOr<Channel::Handle> InMemoryFabric::PostRecv(int rank, int peer, uint64_t tag,
                                                         void* data, size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRank(rank); !s.ok()) return s;
  Request recv;
  recv.is_recv = true;
  recv.peer = peer;
  recv.tag = tag;
  recv.recv = data;
  recv.bytes = bytes;
  absl::StatusOr<Channel::Handle> handle = Allocate(rank, std::move(recv));
  if (!handle.ok()) return handle;
  RankState& state = ranks_[static_cast<size_t>(rank)];
  Request& posted = state.requests[static_cast<size_t>(*handle)];
  for (auto it = state.sends_to.begin(); it != state.sends_to.end(); ++it) {
    if (it->rank != peer) continue;
    Request& send = ranks_[static_cast<size_t>(it->rank)].requests[static_cast<size_t>(it->slot)];
    if (send.tag != tag) continue;
    Deliver(send.send, send.bytes, posted);
    send.done = true;
    state.sends_to.erase(it);
    Changed();
    return handle;
  }
  state.recvs.push_back(*handle);
  return handle;
}

absl::Status InMemoryFabric::Poll(int rank, absl::Time deadline, uint64_t* seen_events) {
  absl::MutexLock lock(&mu_);
  const RankState& state = ranks_[static_cast<size_t>(rank)];
  while (true) {
    if (absl::Status s = CheckRank(rank); !s.ok()) return s;
    // Only requests still waiting on a dead peer fail the call, as on UCX:
    // peers leave as soon as their own part of a call is done.
    const Request* first_pending = nullptr;
    for (const Request& request : state.requests) {
      if (!request.in_use || request.done) continue;
      if (ranks_[static_cast<size_t>(request.peer)].failed) return PeerFailed(request.peer);
      if (first_pending == nullptr) first_pending = &request;
    }
    // Nothing of this rank's is pending (its requests are done, or it has
    // none): a progress step has nothing to wait for, as on UCX.
    if (first_pending == nullptr) return absl::OkStatus();
    if (events_ != *seen_events) {
      *seen_events = events_;
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      // Not blamed (no WithFailedPeer): in a ring that peer may itself wait
      // on another.
      return absl::DeadlineExceededError(
          absl::StrCat("in-memory: timed out waiting for peer rank ", first_pending->peer));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<bool> InMemoryFabric::Test(int rank, Channel::Handle* handle) {
  if (*handle == Channel::kDone) return true;
  absl::MutexLock lock(&mu_);
  RankState& state = ranks_[static_cast<size_t>(rank)];
  Request& request = state.requests[static_cast<size_t>(*handle)];
  CHECK(request.in_use) << "test of a freed handle " << *handle;
  if (!request.done) return false;
  const absl::Status status = std::move(request.status);
  request = Request{};
  state.free.push_back(*handle);
  *handle = Channel::kDone;
  if (!status.ok()) return status;
  return true;
}

void InMemoryFabric::Unqueue(int rank, int slot) {
  const Request& request = ranks_[static_cast<size_t>(rank)].requests[static_cast<size_t>(slot)];
  if (request.is_recv) {
    std::deque<int>& recvs = ranks_[static_cast<size_t>(rank)].recvs;
    recvs.erase(std::remove(recvs.begin(), recvs.end(), slot), recvs.end());
  } else {
    std::deque<RequestId>& sends = ranks_[static_cast<size_t>(request.peer)].sends_to;
    sends.erase(
        std::remove_if(sends.begin(), sends.end(),
                       [&](const RequestId& id) { return id.rank == rank && id.slot == slot; }),
        sends.end());
  }
}

void InMemoryFabric::ReleaseAll(int rank) {
  absl::MutexLock lock(&mu_);
  RankState& state = ranks_[static_cast<size_t>(rank)];
  state.free.clear();
  for (int i = Channel::kMaxRequests - 1; i >= 0; --i) {
    Request& request = state.requests[static_cast<size_t>(i)];
    if (request.in_use && !request.done) Unqueue(rank, i);
    request = Request{};
    state.free.push_back(i);
  }
}

void InMemoryFabric::MarkFailed(int rank) {
  RankState& state = ranks_[static_cast<size_t>(rank)];
  if (state.failed) return;
  state.failed = true;
  // A dead process's messages are gone: nothing may match them any more,
  // and its buffers are never touched again.
  for (int i = 0; i < Channel::kMaxRequests; ++i) {
    Request& request = state.requests[static_cast<size_t>(i)];
    if (!request.in_use || request.done) continue;
    Unqueue(rank, i);
    request.done = true;
    request.status = absl::UnavailableError(absl::StrCat("in-memory: rank ", rank, " failed"));
  }
  Changed();
}

void InMemoryFabric::Abort(int rank, const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  RankState& state = ranks_[static_cast<size_t>(rank)];
  if (state.aborted) return;
  state.aborted = true;
  state.abort_reason = reason;
  Changed();
}

bool InMemoryFabric::aborted(int rank) const {
  absl::MutexLock lock(&mu_);
  return ranks_[static_cast<size_t>(rank)].aborted;
}

absl::Status InMemoryFabric::AbortStatus(int rank) const {
  absl::MutexLock lock(&mu_);
  return AbortedLocked(rank);
}

void InMemoryFabric::Changed() {
  ++events_;
  changed_.SignalAll();
}

InMemoryChannel::InMemoryChannel(InMemoryFabric* fabric, int rank) : fabric_(fabric), rank_(rank) {
  fabric_->Attach(rank_);
  const std::vector<int>& ring = fabric_->ring_order();
  ring_position_ = static_cast<int>(std::find(ring.begin(), ring.end(), rank_) - ring.begin());
}

InMemoryChannel::~InMemoryChannel() { fabric_->Detach(rank_); }

uint64_t InMemoryChannel::CollectiveTag(int source, uint32_t message) const {
  return MakeTag(0, TagKind::kCollective, source, CollectiveLow(sequence_, message));
}

uint64_t InMemoryChannel::PointToPointTag(int source, uint32_t user_tag) const {
  return MakeTag(0, TagKind::kPointToPoint, source, user_tag);
}

absl::StatusOr<Channel::Handle> InMemoryChannel::PostSend(int peer, uint64_t tag, const void* data,
                                                          size_t bytes) {
  return fabric_->PostSend(rank_, peer, tag, data, bytes);
}

absl::StatusOr<Channel::Handle> InMemoryChannel::PostRecv(int peer, uint64_t tag, void* data,
                                                          size_t bytes) {
  return fabric_->PostRecv(rank_, peer, tag, data, bytes);
}

absl::Status InMemoryChannel::Poll() { return fabric_->Poll(rank_, deadline_, &seen_events_); }

absl::StatusOr<bool> InMemoryChannel::Test(Handle* handle) { return fabric_->Test(rank_, handle); }

absl::Status InMemoryChannel::Wait(Handle* handle) {
  while (true) {
    absl::StatusOr<bool> done = Test(handle);
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    if (absl::Status status = Poll(); !status.ok()) return status;
  }
}

void InMemoryChannel::ReleaseAll() { fabric_->ReleaseAll(rank_); }

void InMemoryChannel::BeginCall(absl::Duration timeout) {
  deadline_ = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

}  // namespace cohort::comm
