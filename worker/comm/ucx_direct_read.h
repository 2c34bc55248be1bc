#pragma once
// Direct reads: how UcxCommunicator moves a large point-to-point message
// between two processes on one host with one copy. UCX's shared-memory
// transports copy every byte twice (into a FIFO, out of it) and its cma
// transport, which copies once, is off (UCX 1.13 aborts the process when
// the peer of a cma read has died). So Cohort does the single copy itself:
//
//   sender                                   receiver
//   post receive of the answer               post receive of the offer
//   send offer {address, bytes}  ----------> check the size, then
//                                            process_vm_readv from the sender
//                                            (in 16 MiB pieces, polling the
//                                            channel between: abort, deadline,
//                                            peer death), check the sender is
//                                            the same process still
//   return once answered <------------------ answer kRead
//
// The sender's buffer stays untouched until the answer, as with any Send.
// If the kernel refuses the read (EPERM: ptrace restrictions such as Yama),
// the receiver answers kSendInline and receives the bytes the ordinary way.
// A size mismatch is answered kRefused and both ends fail with
// InvalidArgument. Which messages go this way depends only on facts both
// ends share (the peer on this host, UCX_TLS unset, the size), so they never
// disagree. Offers travel on the message's own point-to-point tag, answers
// on a tag kind of their own (ucx_tags.h).
//
// Thread-safety: as the channel (one call at a time).

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/comm/local_peer.h"
#include "worker/comm/ucx_channel.h"

namespace cohort::comm {

// Messages at least this large go as direct reads. Below, the two extra
// small messages cost more than the copy they save.
inline constexpr size_t kDirectReadMinBytes = size_t{1} << 20;

// One point-to-point send in flight. Its fields are posted to UCX, so it
// must stay where it is (and alive) until Finish returns, or until the
// channel's ReleaseAll after a failed call.
class DirectSend {
 public:
  // Posts the send of `bytes` at `data` to group rank `peer` with `tag`: as
  // a direct read when `direct` (the peer's process) is set and the message
  // is large enough, else as an ordinary message.
  absl::Status Start(UcxChannel& channel, const ProcessIdentity* direct, int peer, uint32_t tag,
                     const void* data, size_t bytes);
  // Waits until the receiver has the bytes (or, for an ordinary message,
  // until UCX is done with the buffer).
  absl::Status Finish(UcxChannel& channel);

 private:
  struct Offer {
    uint64_t magic = 0;
    uint64_t address = 0;
    uint64_t bytes = 0;
  };
  bool direct_ = false;
  int peer_ = 0;
  uint32_t tag_ = 0;
  const void* data_ = nullptr;
  size_t bytes_ = 0;
  UcxChannel::Handle send_ = UcxChannel::kDone;
  UcxChannel::Handle answer_ = UcxChannel::kDone;
  Offer offer_;
  uint64_t answer_value_ = 0;

  friend class DirectRecv;
};

// One point-to-point receive in flight; the same rules as DirectSend.
class DirectRecv {
 public:
  absl::Status Start(UcxChannel& channel, const ProcessIdentity* direct, int peer, uint32_t tag,
                     void* data, size_t bytes);
  absl::Status Finish(UcxChannel& channel);

 private:
  // Reads the offered bytes from the sender's memory: OK, Unavailable (the
  // sender died), PermissionDenied (the kernel refuses: fall back), the
  // channel's errors while polling between pieces.
  absl::Status Read(UcxChannel& channel);
  absl::Status Answer(UcxChannel& channel, uint64_t value);

  const ProcessIdentity* direct_ = nullptr;
  int peer_ = 0;
  uint32_t tag_ = 0;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  UcxChannel::Handle recv_ = UcxChannel::kDone;
  DirectSend::Offer offer_;
  uint64_t answer_value_ = 0;
};

}  // namespace cohort::comm
