#include "worker/comm/ucx_direct_read.h"

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace cohort::comm {
namespace {

constexpr uint64_t kOfferMagic = 0x434f4852'44524431;  // "COHRDRD1"
// Answers to an offer.
constexpr uint64_t kRead = 1;        // the receiver has the bytes
constexpr uint64_t kSendInline = 2;  // the kernel refused the read: send them
constexpr uint64_t kRefused = 3;     // the receiver expected another size
// Bytes per process_vm_readv: the channel is polled between pieces (abort,
// deadline, peer death), about every 3 ms at this machine's 5 GB/s.
constexpr size_t kReadPiece = size_t{16} << 20;

}  // namespace

absl::Status DirectSend::Start(UcxChannel& channel, const ProcessIdentity* direct, int peer,
                               uint32_t tag, const void* data, size_t bytes) {
  direct_ = direct != nullptr && bytes >= kDirectReadMinBytes;
  peer_ = peer;
  tag_ = tag;
  data_ = data;
  bytes_ = bytes;
  send_ = answer_ = UcxChannel::kDone;
  const uint64_t message_tag = channel.PointToPointTag(channel.rank(), tag);
  if (!direct_) {
    ASSIGN_OR_RETURN(send_, channel.PostSend(peer, message_tag, data, bytes));
    return absl::OkStatus();
  }
  // The answer's receive first: it may come as soon as the offer is out.
  ASSIGN_OR_RETURN(answer_, channel.PostRecv(peer, channel.DirectReadAnswerTag(peer, tag),
                                             &answer_value_, sizeof(answer_value_)));
  offer_ = Offer{kOfferMagic, reinterpret_cast<uint64_t>(data), bytes};
  ASSIGN_OR_RETURN(send_, channel.PostSend(peer, message_tag, &offer_, sizeof(offer_)));
  return absl::OkStatus();
}

absl::Status DirectSend::Finish(UcxChannel& channel) {
  RETURN_IF_ERROR(channel.Wait(&send_));
  if (!direct_) return absl::OkStatus();
  RETURN_IF_ERROR(channel.Wait(&answer_));
  switch (answer_value_) {
    case kRead:
      return absl::OkStatus();
    case kSendInline: {
      ASSIGN_OR_RETURN(send_, channel.PostSend(peer_, channel.PointToPointTag(channel.rank(), tag_),
                                               data_, bytes_));
      return channel.Wait(&send_);
    }
    case kRefused:
      return absl::InvalidArgumentError(absl::StrCat("Send: rank ", peer_, " expected a message ",
                                                     "of another size than ", bytes_, " bytes"));
    default:
      return absl::InternalError(
          absl::StrCat("Send: rank ", peer_, " answered a direct read with ", answer_value_));
  }
}

absl::Status DirectRecv::Start(UcxChannel& channel, const ProcessIdentity* direct, int peer,
                               uint32_t tag, void* data, size_t bytes) {
  direct_ = direct != nullptr && bytes >= kDirectReadMinBytes ? direct : nullptr;
  peer_ = peer;
  tag_ = tag;
  data_ = data;
  bytes_ = bytes;
  recv_ = UcxChannel::kDone;
  const uint64_t message_tag = channel.PointToPointTag(peer, tag);
  if (direct_ == nullptr) {
    ASSIGN_OR_RETURN(recv_, channel.PostRecv(peer, message_tag, data, bytes));
  } else {
    ASSIGN_OR_RETURN(recv_, channel.PostRecv(peer, message_tag, &offer_, sizeof(offer_)));
  }
  return absl::OkStatus();
}

absl::Status DirectRecv::Finish(UcxChannel& channel) {
  RETURN_IF_ERROR(channel.Wait(&recv_));
  if (direct_ == nullptr) return absl::OkStatus();
  if (offer_.magic != kOfferMagic) {
    return absl::InternalError(absl::StrCat("Recv: rank ", peer_, " sent no direct-read offer"));
  }
  if (offer_.bytes != bytes_) {
    // Tell the sender, or it waits for an answer until its deadline.
    RETURN_IF_ERROR(Answer(channel, kRefused));
    return absl::InvalidArgumentError(absl::StrCat("Recv: rank ", peer_, " sent ", offer_.bytes,
                                                   " bytes, expected ", bytes_));
  }
  const absl::Status read = Read(channel);
  if (absl::IsPermissionDenied(read)) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      LOG(WARNING) << read.message() << "; large messages from peers on this host take the "
                   << "shared-memory path instead (two copies)";
    }
    RETURN_IF_ERROR(Answer(channel, kSendInline));
    ASSIGN_OR_RETURN(recv_, channel.PostRecv(peer_, channel.PointToPointTag(peer_, tag_), data_,
                                             bytes_));
    return channel.Wait(&recv_);
  }
  RETURN_IF_ERROR(read);
  return Answer(channel, kRead);
}

absl::Status DirectRecv::Read(UcxChannel& channel) {
  const pid_t pid = static_cast<pid_t>(direct_->pid);
  size_t done = 0;
  while (done < bytes_) {
    const size_t want = std::min(kReadPiece, bytes_ - done);
    iovec local{static_cast<char*>(data_) + done, want};
    iovec remote{reinterpret_cast<void*>(offer_.address + done), want};
    const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : EFAULT;
      if (err == EPERM) {
        return absl::PermissionDeniedError(absl::StrCat(
            "process_vm_readv from rank ", peer_, " (pid ", pid, ") is not permitted"));
      }
      if (err == ESRCH || ProcessGone(*direct_)) {
        return absl::UnavailableError(
            absl::StrCat("rank ", peer_, " (pid ", pid, ") died during a direct read"));
      }
      return absl::InternalError(absl::StrCat("process_vm_readv from rank ", peer_, " (pid ", pid,
                                              "): ", std::strerror(err)));
    }
    done += static_cast<size_t>(got);
    if (done < bytes_) RETURN_IF_ERROR(channel.Poll());
  }
  // The sender waits for the answer, so if it is the same process now, the
  // pid named it throughout the read (a live process keeps its pid).
  if (ProcessGone(*direct_)) {
    return absl::UnavailableError(
        absl::StrCat("rank ", peer_, " (pid ", pid, ") died during a direct read"));
  }
  return absl::OkStatus();
}

absl::Status DirectRecv::Answer(UcxChannel& channel, uint64_t value) {
  answer_value_ = value;
  ASSIGN_OR_RETURN(UcxChannel::Handle h,
                   channel.PostSend(peer_, channel.DirectReadAnswerTag(channel.rank(), tag_),
                                    &answer_value_, sizeof(answer_value_)));
  return channel.Wait(&h);
}

}  // namespace cohort::comm
