#include "worker/comm/in_memory_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace cohort::comm {

absl::Status InMemoryCommunicator::Run(absl::Duration timeout, bool collective,
                                       absl::FunctionRef<absl::Status()> body) {
  if (channel_.aborted()) return channel_.AbortStatus();
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
  }
  channel_.BeginCall(timeout);
  if (collective) channel_.NextSequence();
  absl::Status status = body();
  if (status.ok()) return status;
  // An abort that raced with another failure still reads as Aborted.
  if (channel_.aborted()) status = channel_.AbortStatus();
  channel_.ReleaseAll();
  if (!(absl::IsInvalidArgument(status) && !collective)) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = status;
  }
  return status;
}

absl::Status InMemoryCommunicator::AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                                             absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(data, count, "AllReduce"); !s.ok()) return s;
  if (absl::Status s = CheckDataType(type); !s.ok()) return s;
  return Run(timeout, /*collective=*/true, [&]() -> absl::Status {
    if (size() == 1 || count == 0) return absl::OkStatus();
    return ChannelAllReduce(channel_, data, count, type, op, scratch_);
  });
}

absl::Status InMemoryCommunicator::ReduceScatter(const void* input, void* output,
                                                 size_t count_per_rank, DataType type, ReduceOp op,
                                                 absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(input, count_per_rank, "ReduceScatter"); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(output, count_per_rank, "ReduceScatter"); !s.ok()) return s;
  if (absl::Status s = CheckDataType(type); !s.ok()) return s;
  return Run(timeout, /*collective=*/true, [&]() -> absl::Status {
    if (count_per_rank == 0) return absl::OkStatus();
    if (size() == 1) {
      std::memmove(output, input, count_per_rank * DataTypeSize(type));
      return absl::OkStatus();
    }
    return ChannelReduceScatter(channel_, input, output, count_per_rank, type, op, scratch_, work_);
  });
}

absl::Status InMemoryCommunicator::AllGather(const void* input, void* output, size_t count_per_rank,
                                             DataType type, absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(input, count_per_rank, "AllGather"); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(output, count_per_rank, "AllGather"); !s.ok()) return s;
  if (absl::Status s = CheckDataType(type); !s.ok()) return s;
  return Run(timeout, /*collective=*/true, [&]() -> absl::Status {
    if (count_per_rank == 0) return absl::OkStatus();
    const size_t bytes = count_per_rank * DataTypeSize(type);
    auto* own = static_cast<uint8_t*>(output) + bytes * static_cast<size_t>(rank());
    if (own != input) std::memmove(own, input, bytes);
    if (size() == 1) return absl::OkStatus();
    return ChannelAllGather(channel_, output, bytes);
  });
}

absl::Status InMemoryCommunicator::Broadcast(void* data, size_t count, DataType type, int root,
                                             absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(data, count, "Broadcast"); !s.ok()) return s;
  if (absl::Status s = CheckDataType(type); !s.ok()) return s;
  if (absl::Status s = CheckRoot(root, size(), "Broadcast"); !s.ok()) return s;
  return Run(timeout, /*collective=*/true, [&]() -> absl::Status {
    if (size() == 1 || count == 0) return absl::OkStatus();
    return cohort::comm::Broadcast(channel_, data, count * DataTypeSize(type), root);
  });
}

absl::Status InMemoryCommunicator::Send(const void* data, size_t bytes, int peer, uint32_t tag,
                                        absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(data, bytes, "Send"); !s.ok()) return s;
  if (absl::Status s = CheckPeer(peer, rank(), size(), "Send"); !s.ok()) return s;
  return Run(timeout, /*collective=*/false, [&]() -> absl::Status {
    absl::StatusOr<Channel::Handle> send =
        channel_.PostSend(peer, channel_.PointToPointTag(rank(), tag), data, bytes);
    if (!send.ok()) return send.status();
    return channel_.Wait(&*send);
  });
}

absl::Status InMemoryCommunicator::Recv(void* data, size_t bytes, int peer, uint32_t tag,
                                        absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(data, bytes, "Recv"); !s.ok()) return s;
  if (absl::Status s = CheckPeer(peer, rank(), size(), "Recv"); !s.ok()) return s;
  return Run(timeout, /*collective=*/false, [&]() -> absl::Status {
    absl::StatusOr<Channel::Handle> recv =
        channel_.PostRecv(peer, channel_.PointToPointTag(peer, tag), data, bytes);
    if (!recv.ok()) return recv.status();
    return channel_.Wait(&*recv);
  });
}

absl::Status InMemoryCommunicator::SendRecv(const void* send_data, size_t send_bytes, int send_peer,
                                            void* recv_data, size_t recv_bytes, int recv_peer,
                                            uint32_t tag, absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(send_data, send_bytes, "SendRecv"); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(recv_data, recv_bytes, "SendRecv"); !s.ok()) return s;
  for (int peer : {send_peer, recv_peer}) {
    if (absl::Status s = CheckPeer(peer, rank(), size(), "SendRecv"); !s.ok()) return s;
  }
  return Run(timeout, /*collective=*/false, [&]() -> absl::Status {
    // Both in flight before either is waited for: two ranks exchanging
    // with each other must not deadlock, and the channel's rendezvous
    // completes a send only once its receive is posted.
    absl::StatusOr<Channel::Handle> recv = channel_.PostRecv(
        recv_peer, channel_.PointToPointTag(recv_peer, tag), recv_data, recv_bytes);
    if (!recv.ok()) return recv.status();
    absl::StatusOr<Channel::Handle> send =
        channel_.PostSend(send_peer, channel_.PointToPointTag(rank(), tag), send_data, send_bytes);
    if (!send.ok()) return send.status();
    if (absl::Status s = channel_.Wait(&*recv); !s.ok()) return s;
    return channel_.Wait(&*send);
  });
}

absl::Status InMemoryCommunicator::Barrier(absl::Duration timeout) {
  return Run(timeout, /*collective=*/true, [&]() -> absl::Status {
    if (size() == 1) return absl::OkStatus();
    return DisseminationBarrier(channel_);
  });
}

}  // namespace cohort::comm
