#pragma once
// Channel: the transport seam under the collective algorithms
// (ring_algorithms.h). It is the smallest interface they need: post tagged
// sends and receives to group peers, test and wait for them, and make
// progress while checking abort, the call's deadline and failed peers.
// Implementations: UcxChannel (UCP tag messaging, the production path) and
// InMemoryChannel (ranks as threads of one process, for tests).
//
// What a call is (its deadline, its sequence number in the tags, an abort)
// is the implementation's business: the communicator that owns a channel
// starts and ends calls on the concrete type; the algorithms only move
// messages. The cost of the seam is one virtual call per posted message,
// test or poll, never per byte.
//
// Thread-safety: one call at a time (the communicator's contract).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cohort::comm {

class Channel {
 public:
  // Most requests one call keeps outstanding; algorithms size their windows
  // (and choose direct algorithms only when they fit) by this.
  static constexpr int kMaxRequests = 256;
  // An outstanding request; the index of its slot.
  using Handle = int;
  // A handle that is already complete (immediate completion, empty message).
  static constexpr Handle kDone = -1;

  virtual ~Channel() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's place on the ring the ring algorithms run on, and the group
  // rank at ring position `position` (taken modulo size()). Every rank of a
  // group sees the same ring.
  virtual int ring_position() const = 0;
  virtual int ring_rank(int position) const = 0;

  // The tag of message `message` that group rank `source` sends in the
  // current collective call: distinct per (call, source, message), so
  // messages of different calls and senders never match each other.
  virtual uint64_t CollectiveTag(int source, uint32_t message) const = 0;

  // Post a send to / receive from group rank `peer`. The buffer must stay
  // valid until the handle completes (or ReleaseAll()). A receive completes
  // with InvalidArgument if the message is not exactly `bytes` long.
  // Errors: Unavailable (peer dead), ResourceExhausted (no free slot: an
  // algorithm bug), Internal.
  virtual absl::StatusOr<Handle> PostSend(int peer, uint64_t tag, const void* data,
                                          size_t bytes) = 0;
  virtual absl::StatusOr<Handle> PostRecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;

  // One progress step, then the checks. Errors: Aborted, Unavailable (a
  // group peer that an outstanding request waits on died),
  // DeadlineExceeded (the call's deadline passed).
  virtual absl::Status Poll() = 0;
  // Whether *handle completed (then it is set to kDone and its slot freed).
  // Does not progress. Errors: the operation's own failure.
  virtual absl::StatusOr<bool> Test(Handle* handle) = 0;
  // Polls until *handle completes. Errors: as Test and Poll.
  virtual absl::Status Wait(Handle* handle) = 0;

  // After a failed call: cancels outstanding receives and frees every
  // outstanding request, so no later progress writes into the caller's
  // buffers. The algorithms leave this to their caller.
  virtual void ReleaseAll() = 0;
};

// The ring of a group whose rank r runs on `hosts[r]`, as position -> group
// rank: host by host (hosts in order of their first rank, ranks ascending
// within a host; layout::RanksByHost), so a ring crosses each host boundary
// once in each direction however the group is numbered. All labels equal
// (one host, or none known): the rank order.
std::vector<int> HostByHostRing(const std::vector<std::string>& hosts);

}  // namespace cohort::comm
