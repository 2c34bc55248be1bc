#pragma once
// UcxCommunicator: the Communicator for host memory over UCP tag messaging
// (shared memory or TCP, as UCX_TLS selects). One per group; groups share a
// UcxContext (one UCP worker per process) and are kept apart by a 16-bit
// communicator id carried in every tag (ucx_tags.h).
//
// Point to point: a message of kDirectReadMinBytes or more between ranks on
// this host (UCX_TLS unset) is read by the receiver straight from the
// sender's buffer (ucx_direct_read.h); everything else is one UCX message.
//
// Algorithms: when every rank of the group runs on this host (and UCX_TLS is
// unset), AllReduce, ReduceScatter and AllGather above kSharedMemoryMinBytes
// go through shared memory (shm_collectives.h). Otherwise (ring_algorithms.h)
// AllReduce uses a pipelined ring
// (reduce-scatter then allgather) above kDirectMaxBytes of exchanged data
// and a one-round direct exchange below it; ReduceScatter and AllGather
// likewise; Broadcast a direct send below and a pipelined chain above.
// Scratch memory is kept across calls, so steady state allocates nothing.
//
// Errors follow communicator.h. After an error other than InvalidArgument
// (argument checks, or a Recv of a message with another size) every later
// call returns the same error. On an error return the call may leave a send
// in flight that still reads the caller's buffer until the context is
// destroyed; receives are cancelled.
//
// Thread-safety: as Communicator (one call at a time; Abort() from any
// thread). The context must outlive the communicator.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"
#include "worker/comm/ring_algorithms.h"
#include "worker/comm/shm_collectives.h"
#include "worker/comm/ucx_channel.h"
#include "worker/comm/ucx_context.h"
#include "worker/comm/ucx_direct_read.h"

namespace cohort::comm {

struct UcxCommunicatorOptions {
  // Distinct among the live communicators of one context, and equal on all
  // members of a group.
  uint16_t comm_id = 0;
  // World ranks of the group, in group-rank order; empty means the whole
  // world in rank order. Must contain the context's own rank.
  std::vector<int> group{};
};

class UcxCommunicator : public Communicator {
 public:
  // Errors: InvalidArgument (bad group: duplicates, out of range, or missing
  // this rank; reserved id), AlreadyExists (comm_id in use on this context),
  // Internal (the shared-memory segment could not be created).
  static absl::StatusOr<std::unique_ptr<UcxCommunicator>> Create(UcxContext* context,
                                                                 UcxCommunicatorOptions options);
  ~UcxCommunicator() override;

  int rank() const override { return channel_.rank(); }
  int size() const override { return channel_.size(); }
  // This rank's place on the ring the ring algorithms use (host by host).
  int ring_position() const { return channel_.ring_position(); }
  uint16_t comm_id() const { return channel_.comm_id(); }
  // The world (context) rank of group rank `peer`.
  int world_rank(int peer) const { return channel_.world_rank(peer); }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Duration timeout) override;
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank,
                             DataType type, ReduceOp op, absl::Duration timeout) override;
  // Through shared memory when every rank is on this host (one pass, as
  // ReduceScatter); Unimplemented otherwise.
  absl::Status ReduceScatterOrdered(const float* input, size_t count, size_t block, float* output,
                                    const std::vector<std::pair<int, int>>& merges,
                                    absl::Duration timeout) override;
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
  absl::Status Barrier(absl::Duration timeout) override;
  void Abort(const absl::Status& reason) override { channel_.Abort(reason); }

 private:
  struct CallOptions {
    bool collective = true;
  };

  UcxCommunicator(UcxContext* context, uint16_t comm_id, std::vector<int> group, int index);

  // Exchanged bytes (message size times group size) above which a same-host
  // group uses shared memory: below it UCX's direct exchange has the lower
  // latency (2 ranks: 0.8 us vs 1.2 us at 8 B), above it shared memory
  // wins (6.7 us vs 13.3 us at 64 KiB).
  static constexpr size_t kSharedMemoryMinBytes = 4096;
  // Whether a call exchanging `bytes` in total goes through shared memory.
  bool UseSharedMemory(size_t bytes) const {
    return shm_ != nullptr && bytes > kSharedMemoryMinBytes;
  }

  // Checks abort and earlier errors, runs `body`, and on failure releases
  // outstanding requests and (except InvalidArgument from point-to-point
  // calls) marks the communicator broken.
  absl::Status Run(absl::Duration timeout, CallOptions options,
                   absl::FunctionRef<absl::Status()> body);

  // Group rank `peer`'s process when large messages with it are direct
  // reads (ucx_direct_read.h), else null.
  const ProcessIdentity* DirectPeer(int peer) const {
    return context_->DirectReadPeer(channel_.world_rank(peer));
  }

  UcxContext* const context_;
  UcxChannel channel_;
  // The point-to-point call in flight (members: UCX may still hold their
  // offer and answer buffers after a failed call).
  DirectSend send_;
  DirectRecv recv_;
  ScratchBuffer scratch_;
  ScratchBuffer work_;
  std::unique_ptr<ShmCollectives> shm_;  // null unless the group is on this host

  mutable absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::comm
