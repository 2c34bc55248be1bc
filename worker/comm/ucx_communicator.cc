#include "worker/comm/ucx_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace cohort::comm {
absl::StatusOr<std::unique_ptr<UcxCommunicator>> UcxCommunicator::Create(
    UcxContext* context, UcxCommunicatorOptions options) {
  if (context == nullptr) return absl::InvalidArgumentError("ucx communicator: null context");
  std::vector<int> group = std::move(options.group);
  if (group.empty()) {
    for (int r = 0; r < context->size(); ++r) group.push_back(r);
  }
  absl::flat_hash_set<int> seen;
  int index = -1;
  for (size_t i = 0; i < group.size(); ++i) {
    const int r = group[i];
    if (r < 0 || r >= context->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ucx communicator: world rank ", r, " out of range"));
    }
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("ucx communicator: world rank ", r, " listed twice"));
    }
    if (r == context->rank()) index = static_cast<int>(i);
  }
  if (index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ucx communicator: group does not contain rank ",
                                                   context->rank()));
  }
  absl::Status claimed = context->ClaimCommId(options.comm_id);
  if (!claimed.ok()) return claimed;
  std::unique_ptr<UcxCommunicator> communicator(
      new UcxCommunicator(context, options.comm_id, group, index));
  if (group.size() > 1 && context->SharedMemoryGroup(group)) {
    ShmCollectivesOptions shm;
    shm.rank = index;
    shm.size = static_cast<int>(group.size());
    for (int r : group) shm.segment_names.push_back(context->SegmentName(r, options.comm_id));
    absl::StatusOr<std::unique_ptr<ShmCollectives>> created = ShmCollectives::Create(shm);
    // The destructor releases the claimed id.
    if (!created.ok()) return created.status();
    communicator->shm_ = std::move(*created);
  }
  return communicator;
}

UcxCommunicator::UcxCommunicator(UcxContext* context, uint16_t comm_id, std::vector<int> group,
                                 int index)
    : context_(context), channel_(context, comm_id, std::move(group), index) {}

UcxCommunicator::~UcxCommunicator() {
  channel_.ReleaseAll();
  context_->ReleaseCommId(channel_.comm_id());
}

absl::Status UcxCommunicator::Run(absl::Duration timeout, CallOptions options,
                                  absl::FunctionRef<absl::Status()> body) {
  if (channel_.aborted()) return channel_.AbortStatus();
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
  }
  channel_.BeginCall(timeout);
  if (options.collective) channel_.NextSequence();
  absl::Status status = body();
  if (status.ok()) return status;
  // An abort that raced with another failure still reads as Aborted.
  if (channel_.aborted()) status = channel_.AbortStatus();
  channel_.ReleaseAll();
  if (!(absl::IsInvalidArgument(status) && !options.collective)) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = status;
    // Sends of the failed call may still be queued on live endpoints.
    context_->NoteFailedCall();
  }
  return status;
}

absl::Status UcxCommunicator::AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                                        absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(data, count, "AllReduce"); !s.ok()) return s;
  if (absl::Status s = CheckDataType(type); !s.ok()) return s;
  return Run(timeout, CallOptions{}, [&]() -> absl::Status {
    if (size() == 1 || count == 0) return absl::OkStatus();
    const size_t exchanged = count * DataTypeSize(type) * static_cast<size_t>(size());
    if (UseSharedMemory(exchanged)) {
      auto check = [this](int peer) { return channel_.CheckWaiting(peer); };
      return shm_->AllReduce(data, count, type, op, check);
    }
    return ChannelAllReduce(channel_, data, count, type, op, scratch_);
  });
}

absl::Status UcxCommunicator::ReduceScatterOrdered(const float* input, size_t count, size_t block,
                                                   float* output,
                                                   const std::vector<std::pair<int, int>>& merges,
                                                   absl::Duration timeout) {
  if (size() == 1 || !UseSharedMemory(count * sizeof(float))) {
    return Communicator::ReduceScatterOrdered(input, count, block, output, merges, timeout);
  }
  if (absl::Status s = CheckBuffer(input, count, "ReduceScatterOrdered"); !s.ok()) return s;
  if (block * static_cast<size_t>(size()) < count) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceScatterOrdered: ", size(),
                                                   " blocks of ", block, " do not cover ", count));
  }
  for (const auto& [into, from] : merges) {
    if (into < 0 || into >= size() || from < 0 || from >= size() || into == from) {
      return absl::InvalidArgumentError(absl::StrCat("ReduceScatterOrdered: merge (", into, ", ",
                                                     from, ") out of range for ", size(),
                                                     " ranks"));
    }
  }
  return Run(timeout, CallOptions{}, [&]() -> absl::Status {
    auto check = [this](int peer) { return channel_.CheckWaiting(peer); };
    return shm_->ReduceScatterOrdered(input, count, block, output, merges, check);
  });
}

absl::Status UcxCommunicator::ReduceScatter(const void* input, void* output,
                                            size_t count_per_rank, DataType type, ReduceOp op,
                                            absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(input, count_per_rank, "ReduceScatter"); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(output, count_per_rank, "ReduceScatter"); !s.ok()) return s;
  if (absl::Status s = CheckDataType(type); !s.ok()) return s;
  return Run(timeout, CallOptions{}, [&]() -> absl::Status {
    if (count_per_rank == 0) return absl::OkStatus();
    const size_t bytes = count_per_rank * DataTypeSize(type);
    if (size() == 1) {
      std::memmove(output, input, bytes);
      return absl::OkStatus();
    }
    if (UseSharedMemory(bytes * static_cast<size_t>(size()))) {
      auto check = [this](int peer) { return channel_.CheckWaiting(peer); };
      return shm_->ReduceScatter(input, output, count_per_rank, type, op, check);
    }
    return ChannelReduceScatter(channel_, input, output, count_per_rank, type, op, scratch_, work_);
  });
}

absl::Status UcxCommunicator::AllGather(const void* input, void* output, size_t count_per_rank,
                                        DataType type, absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(input, count_per_rank, "AllGather"); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(output, count_per_rank, "AllGather"); !s.ok()) return s;
  if (absl::Status s = CheckDataType(type); !s.ok()) return s;
  return Run(timeout, CallOptions{}, [&]() -> absl::Status {
    if (count_per_rank == 0) return absl::OkStatus();
    const size_t bytes = count_per_rank * DataTypeSize(type);
    auto* own = static_cast<uint8_t*>(output) + bytes * static_cast<size_t>(rank());
    if (own != input) std::memmove(own, input, bytes);
    if (size() == 1) return absl::OkStatus();
    if (UseSharedMemory(bytes * static_cast<size_t>(size()))) {
      auto check = [this](int peer) { return channel_.CheckWaiting(peer); };
      return shm_->AllGather(output, count_per_rank, type, check);
    }
    return ChannelAllGather(channel_, output, bytes);
  });
}

absl::Status UcxCommunicator::Broadcast(void* data, size_t count, DataType type, int root,
                                        absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(data, count, "Broadcast"); !s.ok()) return s;
  if (absl::Status s = CheckDataType(type); !s.ok()) return s;
  if (absl::Status s = CheckRoot(root, size(), "Broadcast"); !s.ok()) return s;
  return Run(timeout, CallOptions{}, [&]() -> absl::Status {
    if (size() == 1 || count == 0) return absl::OkStatus();
    return cohort::comm::Broadcast(channel_, data, count * DataTypeSize(type), root);
  });
}

absl::Status UcxCommunicator::Send(const void* data, size_t bytes, int peer, uint32_t tag,
                                   absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(data, bytes, "Send"); !s.ok()) return s;
  if (absl::Status s = CheckPeer(peer, rank(), size(), "Send"); !s.ok()) return s;
  return Run(timeout, CallOptions{.collective = false}, [&]() -> absl::Status {
    if (absl::Status s = send_.Start(channel_, DirectPeer(peer), peer, tag, data, bytes); !s.ok()) {
      return s;
    }
    return send_.Finish(channel_);
  });
}

absl::Status UcxCommunicator::Recv(void* data, size_t bytes, int peer, uint32_t tag,
                                   absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(data, bytes, "Recv"); !s.ok()) return s;
  if (absl::Status s = CheckPeer(peer, rank(), size(), "Recv"); !s.ok()) return s;
  return Run(timeout, CallOptions{.collective = false}, [&]() -> absl::Status {
    if (absl::Status s = recv_.Start(channel_, DirectPeer(peer), peer, tag, data, bytes); !s.ok()) {
      return s;
    }
    return recv_.Finish(channel_);
  });
}

absl::Status UcxCommunicator::SendRecv(const void* send_data, size_t send_bytes, int send_peer,
                                       void* recv_data, size_t recv_bytes, int recv_peer,
                                       uint32_t tag, absl::Duration timeout) {
  if (absl::Status s = CheckBuffer(send_data, send_bytes, "SendRecv"); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(recv_data, recv_bytes, "SendRecv"); !s.ok()) return s;
  for (int peer : {send_peer, recv_peer}) {
    if (absl::Status s = CheckPeer(peer, rank(), size(), "SendRecv"); !s.ok()) return s;
  }
  return Run(timeout, CallOptions{.collective = false}, [&]() -> absl::Status {
    // The receive is posted first so the peer's send can match at once; the
    // receive is finished first: a direct read's sender waits for the
    // receiver, which may be waiting for its own receive (a ring of
    // exchanges), so every rank must serve what it receives before it waits
    // for its send.
    absl::Status s =
        recv_.Start(channel_, DirectPeer(recv_peer), recv_peer, tag, recv_data, recv_bytes);
    if (s.ok()) s = send_.Start(channel_, DirectPeer(send_peer), send_peer, tag, send_data, send_bytes);
    if (s.ok()) s = recv_.Finish(channel_);
    if (s.ok()) s = send_.Finish(channel_);
    return s;
  });
}

absl::Status UcxCommunicator::Barrier(absl::Duration timeout) {
  return Run(timeout, CallOptions{}, [&]() -> absl::Status {
    if (size() == 1) return absl::OkStatus();
    return DisseminationBarrier(channel_);
  });
}

}  // namespace cohort::comm
