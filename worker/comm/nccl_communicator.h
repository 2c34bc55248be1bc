#pragma once
// NcclCommunicator: the Communicator over NCCL, for buffers in GPU memory.
// Include only where COHORT_HAVE_CUDA is defined (it needs CUDA and NCCL).
//
// Bootstrap: rank 0 calls ncclGetUniqueId and publishes the 128 id bytes
// under "nccl/<comm_id>/unique_id" through the KvClient (scoped to one job
// generation by the caller); the other ranks wait for that key. The NCCL
// communicator is created non-blocking (config.blocking = 0) so that init,
// every call and Abort() can be bounded in time: NCCL returns at once and
// this class polls ncclCommGetAsyncError / cudaStreamQuery until the work is
// done, fails, is aborted or its deadline passes. On a timeout or an
// asynchronous error the NCCL communicator is aborted (ncclCommAbort), which
// also stops kernels blocked on a dead peer.
//
// Buffers: every pointer passed to a collective or to Send/Recv must be
// device-accessible memory (cudaMalloc on this communicator's device, managed
// memory, or mapped pinned host memory). Plain pageable host memory is
// rejected with InvalidArgument before anything reaches NCCL, because NCCL
// would fault on it and poison the whole CUDA context. The work runs on a
// stream owned by this communicator; each call returns only after that
// stream is idle, so callers need no extra synchronization before reading
// results, but must have finished writing inputs (e.g. synchronize their own
// streams) before the call.
//
// Send/Recv: NCCL has no tags. Only tag 0 is accepted (InvalidArgument
// otherwise); messages between a pair of ranks match in the order sent.
// Concurrent streams of messages that need isolation use separate
// communicators (one per mesh axis or purpose). NCCL also cannot tell a
// receiver the size of the message: Send and Recv must agree on `bytes`;
// a mismatch is a caller bug NCCL does not detect (at worst it surfaces as
// DeadlineExceeded). Sending to oneself is InvalidArgument (with one call at
// a time it could never complete).
//
// Errors follow communicator.h, plus: a CUDA fault on this device (e.g. an
// out-of-bounds buffer) is Internal, since it is neither a peer failure nor
// retryable; after any error but InvalidArgument later calls return
// FailedPrecondition (or Aborted, after Abort()).
//
// Thread-safety: as Communicator: one call at a time, from any thread (each
// call selects the device itself); Abort() from any thread at any time.
// Destroying the object while a call is in flight is a caller bug.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/comm/communicator.h"
#include "worker/comm/kv_client.h"

namespace cohort::comm {

// Which group this process joins, and as what.
struct NcclGroupSpec {
  int rank = 0;
  int size = 1;
  // Names the group in KV keys ("nccl/<comm_id>/unique_id") and NCCL logs;
  // unique within the KV scope, e.g. "data.3" for data group 3. Not empty;
  // keep to [A-Za-z0-9._-/] so that every KvClient accepts the key.
  std::string comm_id;
  // CUDA device index (as numbered under CUDA_VISIBLE_DEVICES).
  int device = 0;
};

struct NcclCommunicatorOptions {
  // Bounds Create() as a whole: waiting for the unique id and NCCL init.
  absl::Duration init_timeout = absl::Seconds(60);
  // The destructor lets a healthy communicator finalize (flush and free in
  // agreement with its peers) for this long, then aborts it.
  absl::Duration finalize_timeout = absl::Seconds(10);
  // Sleep between polls once a call has been waiting a while (the first
  // polls only yield the CPU, for latency on small messages).
  absl::Duration poll_interval = absl::Microseconds(50);
  // Deadlines are measured on this clock. Not owned; must outlive the object.
  const Clock* clock = RealClock::Get();
};

class NcclCommunicator : public Communicator {
 public:
  // Joins the group `spec` describes. `kv` is used only during Create and may
  // be null when spec.size == 1. Errors:
  //   InvalidArgument    bad spec (rank/size/device out of range, empty id)
  //   FailedPrecondition no usable CUDA device or driver on this host
  //   DeadlineExceeded   the id or the peers did not arrive within init_timeout
  //   Unavailable        a peer or the network failed during init
  //   DataLoss           the published id is not NCCL_UNIQUE_ID_BYTES long
  //   other KvClient errors, as returned by it (e.g. Aborted)
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      KvClient* kv, const NcclGroupSpec& spec, const NcclCommunicatorOptions& options);

  // Finalizes (bounded by finalize_timeout) or aborts the NCCL communicator
  // and frees the stream and scratch memory.
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return spec_.rank; }
  int size() const override { return spec_.size; }
  int device() const { return spec_.device; }
  // The stream every call runs on (for callers that want to order their own
  // kernels after a call; calls already wait for it).
  cudaStream_t stream() const { return stream_; }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Duration timeout) override;
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank, DataType type,
                             ReduceOp op, absl::Duration timeout) override;
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank, DataType type,
                         absl::Duration timeout) override;
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Duration timeout) override;
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override;
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override;
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override;
  // An AllReduce of one int32 on the device.
  absl::Status Barrier(absl::Duration timeout) override;
  // Marks the communicator aborted and calls ncclCommAbort, so a waiting call
  // returns Aborted at its next poll. Idempotent.
  void Abort(const absl::Status& reason) override;

 private:
  using Enqueue = absl::FunctionRef<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;

  NcclCommunicator(const NcclGroupSpec& spec, const NcclCommunicatorOptions& options);

  // Allocates the stream and scratch memory, then runs non-blocking init.
  absl::Status Init(const ncclUniqueId& id, absl::Time deadline);
  // Enqueues one NCCL operation and waits for it to finish (see class comment).
  absl::Status Run(const char* what, absl::Duration timeout, Enqueue enqueue);
  // Send's and Recv's checks of peer, tag and buffer, then Run.
  absl::Status PointToPoint(const char* what, const void* data, size_t bytes, int peer,
                            uint32_t tag, absl::Duration timeout, Enqueue enqueue);
  // Polls until the last enqueued operation has completed on the stream.
  absl::Status WaitForCompletion(const char* what, absl::Time deadline);
  // OK while usable; otherwise the status every call returns from now on.
  absl::Status UsableStatus() const;
  // Records `status` as the reason the communicator is unusable and aborts
  // the NCCL communicator. Returns `status`.
  absl::Status FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_);
  // InvalidArgument unless `ptr` is device-accessible memory on this device.
  absl::Status CheckDeviceBuffer(const void* ptr, const char* name) const;

  const NcclGroupSpec spec_;
  const NcclCommunicatorOptions options_;
  cudaStream_t stream_ = nullptr;    // owned; set in Init, then constant
  int32_t* barrier_word_ = nullptr;  // device memory for Barrier; set in Init

  // Set (before ncclCommAbort runs) by Abort(), so a waiting call can return
  // without taking comm_mu_, which Abort holds while NCCL tears down.
  std::atomic<bool> aborted_{false};
  mutable absl::Mutex state_mu_;
  absl::Status abort_status_ ABSL_GUARDED_BY(state_mu_);    // Aborted, once Abort() ran
  absl::Status failure_status_ ABSL_GUARDED_BY(state_mu_);  // first fatal error

  // Guards the handle against use after ncclCommAbort frees it: every NCCL
  // call on comm_ holds this lock. Null before init and after abort.
  // Lock order: comm_mu_ before state_mu_.
  mutable absl::Mutex comm_mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_) = nullptr;
};

}  // namespace cohort::comm
