#pragma once
// HierarchicalCommunicator: a group spanning hosts, as three UCX
// communicators on one context: the whole group (flat), this host's members
// (local: shared memory when UCX_TLS is unset) and this rank's lane (the
// members with the same local index on every host). A large AllReduce is
//
//   local reduce-scatter -> lane all-reduce of this rank's slice -> local all-gather
//
// so each host sends 2 (H-1)/H of the buffer across its link, H hosts, in L
// lanes at once, where the flat ring (n = H L ranks, host by host) sends
// 2 (n-1)/n: 1.5x less for 2 hosts of 2 ranks. Every rank gets the same bits:
// the local reduce-scatter reduces each block in rank order on its owner, the
// lane ring gives its members identical bits, the all-gather copies. Every
// other call, and all-reduces below kHierarchicalMinBytes (latency-bound),
// goes to the flat group.
//
// Thread-safety: as UcxCommunicator (Abort from any thread).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"

namespace cohort::comm {

// All-reduces of fewer bytes take the flat group.
inline constexpr size_t kHierarchicalMinBytes = 256 * 1024;

// Where a group rank sits in a group split by host.
struct HostSplit {
  std::vector<int> local;  // group ranks on this rank's host, ascending
  std::vector<int> lane;   // group ranks with this rank's local index, hosts in order of first rank
};

// The split of group rank `index` given each group rank's host: nullopt
// unless the group spans two hosts or more and every host holds the same
// number (two or more) of its ranks.
std::optional<HostSplit> SplitByHost(const std::vector<std::string>& host_of_group_rank, int index);

// How a group that spans hosts runs its collectives.
enum class CollectiveAlgorithm {
  kAuto,          // hierarchical where the hosts allow (SplitByHost), else flat
  kFlat,          // one ring over the whole group (host by host)
  kHierarchical,  // as kAuto, but an error where the hosts do not allow it
};
// "auto", "flat", "hierarchical"; InvalidArgument otherwise.
absl::StatusOr<CollectiveAlgorithm> ParseCollectiveAlgorithm(const std::string& name);

class HierarchicalCommunicator : public Communicator {
 public:
  // `flat` as for UcxCommunicator::Create; `local_id` and `lane_id` are the
  // sub-groups' communicator ids (distinct from every other live id of the
  // context, equal on all members). Returns the flat communicator alone
  // when `algorithm` is kFlat, or kAuto and the hosts do not allow a split
  // (InvalidArgument for kHierarchical then). Errors: UcxCommunicator's.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(UcxContext* context,
                                                              UcxCommunicatorOptions flat,
                                                              uint16_t local_id, uint16_t lane_id,
                                                              CollectiveAlgorithm algorithm);

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  int hosts() const { return lane_->size(); }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Duration timeout) override;
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank,
                             DataType type, ReduceOp op, absl::Duration timeout) override {
    return flat_->ReduceScatter(input, output, count_per_rank, type, op, timeout);
  }
  absl::Status ReduceScatterOrdered(const float* input, size_t count, size_t block, float* output,
                                    const std::vector<std::pair<int, int>>& merges,
                                    absl::Duration timeout) override {
    return flat_->ReduceScatterOrdered(input, count, block, output, merges, timeout);
  }
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank, DataType type,
                         absl::Duration timeout) override {
    return flat_->AllGather(input, output, count_per_rank, type, timeout);
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Duration timeout) override {
    return flat_->Broadcast(data, count, type, root, timeout);
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return flat_->Send(data, bytes, peer, tag, timeout);
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return flat_->Recv(data, bytes, peer, tag, timeout);
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    return flat_->SendRecv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer, tag,
                           timeout);
  }
  absl::Status Barrier(absl::Duration timeout) override { return flat_->Barrier(timeout); }
  void Abort(const absl::Status& reason) override;

 private:
  HierarchicalCommunicator(std::unique_ptr<UcxCommunicator> flat,
                           std::unique_ptr<UcxCommunicator> local,
                           std::unique_ptr<UcxCommunicator> lane)
      : flat_(std::move(flat)), local_(std::move(local)), lane_(std::move(lane)) {}

  std::unique_ptr<UcxCommunicator> flat_, local_, lane_;
  // Reused across calls: the padded buffer (when the count does not divide
  // by the local size) and this rank's slice.
  std::vector<uint8_t> padded_, slice_;
};

}  // namespace cohort::comm
