#pragma once
// InMemoryCommunicator: a Communicator whose ranks are threads of one
// process, over InMemoryChannel (in_memory_channel.h). Its collectives are
// UcxCommunicator's algorithms for a group without shared memory
// (ring_algorithms.h: direct exchange below kDirectMaxBytes, pipelined ring
// above; a chain or direct broadcast; a dissemination barrier), so unit
// tests of the code above the seam (TreeReducer, DataParallel, StepRunner)
// run the production algorithms, in process, with the failure injection of
// InMemoryFabric. ReduceScatterOrdered is Unimplemented (as UCX over TCP:
// the caller's pairwise exchange runs) and AllGatherRanges the default.
//
// Errors follow communicator.h and UcxCommunicator: after an error other
// than InvalidArgument from a point-to-point call every later call returns
// the same error; outstanding requests of a failed call are released.
//
// Thread-safety: as Communicator (one call at a time; Abort() from any
// thread). The fabric must outlive the communicator.

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"
#include "worker/comm/in_memory_channel.h"
#include "worker/comm/ring_algorithms.h"

namespace cohort::comm {

class InMemoryCommunicator : public Communicator {
 public:
  // Rank `rank` of `fabric`'s group; at most one communicator per rank.
  InMemoryCommunicator(InMemoryFabric* fabric, int rank) : channel_(fabric, rank) {}

  int rank() const override { return channel_.rank(); }
  int size() const override { return channel_.size(); }

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
  absl::Status Barrier(absl::Duration timeout) override;
  void Abort(const absl::Status& reason) override { channel_.Abort(reason); }

 private:
  // Checks abort and earlier errors, runs `body`, and on failure releases
  // outstanding requests and (except InvalidArgument from point-to-point
  // calls) marks the communicator broken.
  absl::Status Run(absl::Duration timeout, bool collective, absl::FunctionRef<absl::Status()> body);

  InMemoryChannel channel_;
  ScratchBuffer scratch_;
  ScratchBuffer work_;
  mutable absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::comm
