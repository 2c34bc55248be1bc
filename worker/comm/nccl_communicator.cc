#include "worker/comm/nccl_communicator.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/comm/nccl_status.h"

namespace cohort::comm {
namespace {

// Polls before the first sleep: yielding keeps small-message latency near the
// GPU's own (a sleep costs ~50-100 us of scheduler latency).
constexpr int kYieldPolls = 2000;

void Pause(int polls, absl::Duration interval) {
  if (polls < kYieldPolls) {
    std::this_thread::yield();
  } else {
    absl::SleepFor(interval);
  }
}

// Makes `device` current for the calling thread and restores the previous
// device on destruction, so a call does not change its caller's CUDA state.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_) status_ = CudaErrorToStatus(cudaSetDevice(device_), "cudaSetDevice");
  }
  ~ScopedDevice() {
    if (previous_ >= 0 && previous_ != device_ && status_.ok()) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  const int device_;
  int previous_ = -1;
  absl::Status status_;
};

// `status` with `context` in front of its message, same code.
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

absl::Status CheckCount(const void* ptr, size_t count, const char* name) {
  if (ptr == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is null but count is ", count));
  }
  return absl::OkStatus();
}

// The argument checks ReduceScatter and AllGather share: size() blocks of
// count_per_rank elements must be addressable, and neither buffer may be
// null unless the blocks are empty.
absl::Status CheckBlockBuffers(const void* input, const void* output, size_t count_per_rank,
                               size_t element, int size) {
  if (count_per_rank > std::numeric_limits<size_t>::max() / element / static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("count_per_rank ", count_per_rank, " overflows size_t"));
  }
  RETURN_IF_ERROR(CheckCount(input, count_per_rank, "input"));
  return CheckCount(output, count_per_rank, "output");
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    KvClient* kv, const NcclGroupSpec& spec, const NcclCommunicatorOptions& options) {
  if (spec.size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("group size must be >= 1, got ", spec.size));
  }
  if (spec.rank < 0 || spec.rank >= spec.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", spec.rank, " is outside [0, ", spec.size, ")"));
  }
  if (spec.comm_id.empty()) return absl::InvalidArgumentError("comm_id must not be empty");
  if (spec.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device must be >= 0, got ", spec.device));
  }
  if (kv == nullptr && spec.size > 1) {
    return absl::InvalidArgumentError("a KvClient is required for a group of more than one rank");
  }
  if (options.clock == nullptr) return absl::InvalidArgumentError("options.clock is null");
  const absl::Time deadline = options.clock->Now() + options.init_timeout;

  int count = 0;
  const cudaError_t count_error = cudaGetDeviceCount(&count);
  if (count_error != cudaSuccess) {
    // Whatever the code, this host cannot run NCCL: an operator fixes that.
    return absl::FailedPreconditionError(
        CudaErrorToStatus(count_error, "no usable CUDA device: cudaGetDeviceCount").message());
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device is visible");
  if (spec.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", spec.device, " but only ", count, " CUDA device(s) are visible"));
  }
  ScopedDevice device(spec.device);
  RETURN_IF_ERROR(device.status());

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  const std::string key = absl::StrCat("nccl/", spec.comm_id, "/unique_id");
  if (spec.rank == 0) {
    RETURN_IF_ERROR(NcclResultToStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    // A one-rank group has nobody to tell.
    if (spec.size > 1) {
      RETURN_IF_ERROR(Annotate(kv->Set(key, std::string(id.internal, sizeof(id.internal))),
                               absl::StrCat("publishing ", key)));
    }
  } else {
    const absl::Duration remaining =
        std::max(deadline - options.clock->Now(), absl::ZeroDuration());
    absl::StatusOr<std::string> bytes = kv->WaitFor(key, remaining);
    if (!bytes.ok()) return Annotate(bytes.status(), absl::StrCat("waiting for ", key));
    if (bytes->size() != sizeof(id.internal)) {
      return absl::DataLossError(
          absl::StrCat(key, " holds ", bytes->size(), " bytes, expected ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }

  auto comm = absl::WrapUnique(new NcclCommunicator(spec, options));
  RETURN_IF_ERROR(comm->Init(id, deadline));
  return comm;
}

NcclCommunicator::NcclCommunicator(const NcclGroupSpec& spec,
                                   const NcclCommunicatorOptions& options)
    : spec_(spec), options_(options) {}

absl::Status NcclCommunicator::Init(const ncclUniqueId& id, absl::Time deadline) {
  RETURN_IF_ERROR(CudaErrorToStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                    "cudaStreamCreateWithFlags"));
  void* word = nullptr;
  RETURN_IF_ERROR(CudaErrorToStatus(cudaMalloc(&word, sizeof(int32_t)), "cudaMalloc"));
  barrier_word_ = static_cast<int32_t*>(word);
  RETURN_IF_ERROR(CudaErrorToStatus(cudaMemsetAsync(barrier_word_, 0, sizeof(int32_t), stream_),
                                    "cudaMemsetAsync"));
  RETURN_IF_ERROR(CudaErrorToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;                      // so that init, calls and abort can all be bounded
  config.commName = spec_.comm_id.c_str();  // spec_ outlives the NCCL communicator
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, spec_.size, id, spec_.rank, &config);
  const std::string what =
      absl::StrCat("NCCL init of ", spec_.comm_id, " rank ", spec_.rank, "/", spec_.size);
  if (started != ncclSuccess && started != ncclInProgress) {
    absl::Status status = NcclResultToStatus(started, what, ncclGetLastError(comm));
    if (comm != nullptr) (void)ncclCommAbort(comm);
    return status;
  }
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) state = query;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      absl::Status status = NcclResultToStatus(state, what, ncclGetLastError(comm));
      (void)ncclCommAbort(comm);
      return status;
    }
    if (options_.clock->Now() >= deadline) {
      (void)ncclCommAbort(comm);
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not finish within ", absl::FormatDuration(options_.init_timeout),
                       "; are all ranks up and on distinct devices?"));
    }
    Pause(polls, options_.poll_interval);
  }
  absl::MutexLock lock(&comm_mu_);
  comm_ = comm;
  return absl::OkStatus();
}

NcclCommunicator::~NcclCommunicator() {
  ScopedDevice device(spec_.device);
  ncclComm_t comm = nullptr;
  {
    absl::MutexLock lock(&comm_mu_);
    std::swap(comm, comm_);
  }
  if (comm != nullptr) {
    // Finalize needs the peers to agree; a dead peer would stall it, hence
    // the bound and the abort behind it.
    bool finalized = false;
    const ncclResult_t started = ncclCommFinalize(comm);
    if (started == ncclSuccess || started == ncclInProgress) {
      const absl::Time deadline = options_.clock->Now() + options_.finalize_timeout;
      for (int polls = 0;; ++polls) {
        ncclResult_t state = ncclInProgress;
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
        if (state != ncclInProgress) {
          finalized = state == ncclSuccess;
          break;
        }
        if (options_.clock->Now() >= deadline) break;
        Pause(polls, options_.poll_interval);
      }
    }
    if (finalized) {
      (void)ncclCommDestroy(comm);
    } else {
      LOG(WARNING) << "NCCL communicator " << spec_.comm_id << " rank " << spec_.rank
                   << " did not finalize cleanly; aborting it";
      (void)ncclCommAbort(comm);
    }
  }
  if (barrier_word_ != nullptr) (void)cudaFree(barrier_word_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::Status NcclCommunicator::UsableStatus() const {
  absl::MutexLock lock(&state_mu_);
  if (!abort_status_.ok()) return abort_status_;
  if (!failure_status_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL communicator ", spec_.comm_id, " is unusable after an earlier error (",
                     failure_status_.ToString(), "); build a new one"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::FailLocked(absl::Status status) {
  {
    absl::MutexLock lock(&state_mu_);
    if (failure_status_.ok()) failure_status_ = status;
  }
  if (comm_ != nullptr) {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  return status;
}

void NcclCommunicator::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&state_mu_);
    if (!abort_status_.ok()) return;
    abort_status_ = absl::AbortedError(absl::StrCat("NCCL communicator ", spec_.comm_id, " rank ",
                                                    spec_.rank, " aborted: ", reason.ToString()));
    aborted_.store(true, std::memory_order_release);
  }
  // Safe while another thread waits on the stream: the communicator is
  // non-blocking, so the abort stops its kernels instead of waiting for them,
  // and comm_mu_ keeps the waiter from touching the freed handle.
  absl::MutexLock lock(&comm_mu_);
  if (comm_ != nullptr) {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

absl::Status NcclCommunicator::CheckDeviceBuffer(const void* ptr, const char* name) const {
  cudaPointerAttributes attributes;
  std::memset(&attributes, 0, sizeof(attributes));
  const cudaError_t error = cudaPointerGetAttributes(&attributes, ptr);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error so later calls don't see it
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is not a CUDA pointer: ", CudaErrorToStatus(error, "").message()));
  }
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
      if (attributes.device != spec_.device) {
        return absl::InvalidArgumentError(absl::StrCat(name, " is on device ", attributes.device,
                                                       ", the communicator on device ",
                                                       spec_.device));
      }
      return absl::OkStatus();
    case cudaMemoryTypeManaged:
      return absl::OkStatus();
    case cudaMemoryTypeHost:
      if (attributes.devicePointer == nullptr) break;
      return absl::OkStatus();
    case cudaMemoryTypeUnregistered:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, " is host memory; NcclCommunicator needs device memory (cudaMalloc)"));
}

absl::Status NcclCommunicator::Run(const char* what, absl::Duration timeout, Enqueue enqueue) {
  const absl::Time deadline = options_.clock->Now() + timeout;
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) {
      RETURN_IF_ERROR(UsableStatus());
      return absl::InternalError("NCCL communicator has no handle");
    }
    const ncclResult_t result = enqueue(comm_, stream_);
    if (result != ncclSuccess && result != ncclInProgress) {
      return FailLocked(NcclResultToStatus(result, what, ncclGetLastError(comm_)));
    }
  }
  return WaitForCompletion(what, deadline);
}

absl::Status NcclCommunicator::WaitForCompletion(const char* what, absl::Time deadline) {
  for (int polls = 0;; ++polls) {
    if (aborted_.load(std::memory_order_acquire)) return UsableStatus();
    {
      absl::MutexLock lock(&comm_mu_);
      if (comm_ == nullptr) return UsableStatus();
      // ncclInProgress: a non-blocking enqueue has not reached the stream yet,
      // so an idle stream does not mean done.
      ncclResult_t state = ncclInProgress;
      const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
      if (query != ncclSuccess) state = query;
      if (state != ncclSuccess && state != ncclInProgress) {
        // Remote and local NCCL failures alike end this group's generation.
        const absl::Status cause = NcclResultToStatus(
            state, absl::StrCat(what, " on rank ", spec_.rank), ncclGetLastError(comm_));
        return FailLocked(absl::UnavailableError(cause.message()));
      }
      if (state == ncclSuccess) {
        const cudaError_t stream_state = cudaStreamQuery(stream_);
        if (stream_state == cudaSuccess) return absl::OkStatus();
        if (stream_state != cudaErrorNotReady) {
          return FailLocked(CudaErrorToStatus(stream_state, what));
        }
      }
      if (options_.clock->Now() >= deadline) {
        return FailLocked(absl::DeadlineExceededError(
            absl::StrCat(what, " on rank ", spec_.rank, " of ", spec_.comm_id,
                         " did not complete within its timeout; a peer may be dead or stalled")));
      }
    }
    Pause(polls, options_.poll_interval);
  }
}

absl::Status NcclCommunicator::AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                                         absl::Duration timeout) {
  ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclDataType(type));
  ASSIGN_OR_RETURN(const ncclRedOp_t nccl_op, ToNcclRedOp(op));
  RETURN_IF_ERROR(CheckCount(data, count, "data"));
  RETURN_IF_ERROR(UsableStatus());
  if (count == 0) return absl::OkStatus();
  ScopedDevice device(spec_.device);
  RETURN_IF_ERROR(device.status());
  RETURN_IF_ERROR(CheckDeviceBuffer(data, "data"));
  return Run("AllReduce", timeout, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(data, data, count, nccl_type, nccl_op, comm, stream);
  });
}

absl::Status NcclCommunicator::ReduceScatter(const void* input, void* output, size_t count_per_rank,
                                             DataType type, ReduceOp op, absl::Duration timeout) {
  ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclDataType(type));
  ASSIGN_OR_RETURN(const ncclRedOp_t nccl_op, ToNcclRedOp(op));
  const size_t element = DataTypeSize(type);
  RETURN_IF_ERROR(CheckBlockBuffers(input, output, count_per_rank, element, spec_.size));
  RETURN_IF_ERROR(UsableStatus());
  if (count_per_rank == 0) return absl::OkStatus();
  if (Overlap(input, count_per_rank * element * spec_.size, output, count_per_rank * element)) {
    return absl::InvalidArgumentError("ReduceScatter input and output overlap");
  }
  ScopedDevice device(spec_.device);
  RETURN_IF_ERROR(device.status());
  RETURN_IF_ERROR(CheckDeviceBuffer(input, "input"));
  RETURN_IF_ERROR(CheckDeviceBuffer(output, "output"));
  return Run("ReduceScatter", timeout, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclReduceScatter(input, output, count_per_rank, nccl_type, nccl_op, comm, stream);
  });
}

absl::Status NcclCommunicator::AllGather(const void* input, void* output, size_t count_per_rank,
                                         DataType type, absl::Duration timeout) {
  ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclDataType(type));
  const size_t element = DataTypeSize(type);
  RETURN_IF_ERROR(CheckBlockBuffers(input, output, count_per_rank, element, spec_.size));
  RETURN_IF_ERROR(UsableStatus());
  if (count_per_rank == 0) return absl::OkStatus();
  const size_t block_bytes = count_per_rank * element;
  const void* own_block = static_cast<const char*>(output) + spec_.rank * block_bytes;
  // NCCL supports exactly one in-place layout: input is this rank's block.
  if (input != own_block && Overlap(input, block_bytes, output, block_bytes * spec_.size)) {
    return absl::InvalidArgumentError(
        "AllGather input overlaps output without being this rank's own block");
  }
  ScopedDevice device(spec_.device);
  RETURN_IF_ERROR(device.status());
  RETURN_IF_ERROR(CheckDeviceBuffer(input, "input"));
  RETURN_IF_ERROR(CheckDeviceBuffer(output, "output"));
  return Run("AllGather", timeout, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllGather(input, output, count_per_rank, nccl_type, comm, stream);
  });
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t count, DataType type, int root,
                                         absl::Duration timeout) {
  ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclDataType(type));
  if (root < 0 || root >= spec_.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("root ", root, " is outside [0, ", spec_.size, ")"));
  }
  RETURN_IF_ERROR(CheckCount(data, count, "data"));
  RETURN_IF_ERROR(UsableStatus());
  if (count == 0) return absl::OkStatus();
  ScopedDevice device(spec_.device);
  RETURN_IF_ERROR(device.status());
  RETURN_IF_ERROR(CheckDeviceBuffer(data, "data"));
  return Run("Broadcast", timeout, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(data, data, count, nccl_type, root, comm, stream);
  });
}

namespace {

absl::Status CheckPeerAndTag(int peer, uint32_t tag, int rank, int size) {
  if (tag != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclCommunicator does not support tags (got ", tag,
        "); use tag 0 and a separate communicator for each independent message stream"));
  }
  if (peer < 0 || peer >= size) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", peer, " is outside [0, ", size, ")"));
  }
  if (peer == rank) {
    return absl::InvalidArgumentError("NcclCommunicator cannot send to or receive from itself");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NcclCommunicator::PointToPoint(const char* what, const void* data, size_t bytes,
                                            int peer, uint32_t tag, absl::Duration timeout,
                                            Enqueue enqueue) {
  RETURN_IF_ERROR(CheckPeerAndTag(peer, tag, spec_.rank, spec_.size));
  RETURN_IF_ERROR(CheckCount(data, bytes, "data"));
  RETURN_IF_ERROR(UsableStatus());
  if (bytes == 0) return absl::OkStatus();
  ScopedDevice device(spec_.device);
  RETURN_IF_ERROR(device.status());
  RETURN_IF_ERROR(CheckDeviceBuffer(data, "data"));
  return Run(what, timeout, enqueue);
}

absl::Status NcclCommunicator::Send(const void* data, size_t bytes, int peer, uint32_t tag,
                                    absl::Duration timeout) {
  return PointToPoint("Send", data, bytes, peer, tag, timeout,
                      [&](ncclComm_t comm, cudaStream_t stream) {
                        return ncclSend(data, bytes, ncclUint8, peer, comm, stream);
                      });
}

absl::Status NcclCommunicator::Recv(void* data, size_t bytes, int peer, uint32_t tag,
                                    absl::Duration timeout) {
  return PointToPoint("Recv", data, bytes, peer, tag, timeout,
                      [&](ncclComm_t comm, cudaStream_t stream) {
                        return ncclRecv(data, bytes, ncclUint8, peer, comm, stream);
                      });
}

absl::Status NcclCommunicator::SendRecv(const void* send_data, size_t send_bytes, int send_peer,
                                        void* recv_data, size_t recv_bytes, int recv_peer,
                                        uint32_t tag, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckPeerAndTag(send_peer, tag, spec_.rank, spec_.size));
  RETURN_IF_ERROR(CheckPeerAndTag(recv_peer, tag, spec_.rank, spec_.size));
  RETURN_IF_ERROR(CheckCount(send_data, send_bytes, "send_data"));
  RETURN_IF_ERROR(CheckCount(recv_data, recv_bytes, "recv_data"));
  RETURN_IF_ERROR(UsableStatus());
  ScopedDevice device(spec_.device);
  RETURN_IF_ERROR(device.status());
  if (send_bytes > 0) RETURN_IF_ERROR(CheckDeviceBuffer(send_data, "send_data"));
  if (recv_bytes > 0) RETURN_IF_ERROR(CheckDeviceBuffer(recv_data, "recv_data"));
  return Run("SendRecv", timeout, [&](ncclComm_t comm, cudaStream_t stream) {
    // One group: NCCL progresses both together, so a pair of ranks sending
    // to each other cannot deadlock.
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return result;
    if (send_bytes > 0) result = ncclSend(send_data, send_bytes, ncclUint8, send_peer, comm, stream);
    if (result == ncclSuccess && recv_bytes > 0) {
      result = ncclRecv(recv_data, recv_bytes, ncclUint8, recv_peer, comm, stream);
    }
    const ncclResult_t ended = ncclGroupEnd();
    return result != ncclSuccess ? result : ended;
  });
}

absl::Status NcclCommunicator::Barrier(absl::Duration timeout) {
  RETURN_IF_ERROR(UsableStatus());
  ScopedDevice device(spec_.device);
  RETURN_IF_ERROR(device.status());
  // Max keeps the word at 0 however many barriers run (a sum would overflow).
  return Run("Barrier", timeout, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclMax, comm, stream);
  });
}

}  // namespace cohort::comm
