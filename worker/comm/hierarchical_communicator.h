#pragma once
// HierarchicalCommunicator: a group spanning hosts, as three UCX
// communicators on one context: the whole group (flat), this host's members
// (local: shared memory when UCX_TLS is unset) and this rank's lane (the
// members with the same local index on every host). With H hosts of L ranks
// each (n = H L), large collectives go
//
//   AllReduce:            local reduce-scatter -> lane all-reduce -> local all-gather
//   ReduceScatter:        local reduce-scatter -> lane reduce-scatter
//   ReduceScatterOrdered: local ordered reduce-scatter -> lane ordered exchange
//   AllGather:            lane all-gather -> local all-gather
//   AllGatherRanges:      lane exchange -> local exchange
//
// so each host sends (H-1)/H of the buffer per pass across its link, in L
// lanes at once, where the flat ring (host by host) sends (n-1)/n per rank
// crossing (1.5x less for 2 hosts of 2 ranks) and a flat pairwise exchange
// sends L (n-L)/n (2x less for 2 x 2). For the local phases the group's
// blocks are restaged lane by lane (local rank l's share is the blocks of
// lane l's members, hosts in order), one memory copy per pass.
//
// Every rank gets the same bits: the local reduce-scatter reduces each block
// in rank order on its owner, the lane ring gives its members identical
// bits, the gathers copy. ReduceScatterOrdered keeps the caller's order of
// additions exactly: it runs hierarchically only when the merges first fold
// each host's ranks into its first rank (merges within a host, none after a
// merge across hosts that touches them) and then fold those across hosts;
// any other order goes to the flat group, which exchanges point to point.
// Calls below kHierarchicalMinBytes (latency-bound) and every other call go
// to the flat group.
//
// The lane runs on a UCP worker of its own: a second UcxContext over the
// lane's members, bootstrapped like the caller's. Every large collective
// above pipelines: it runs in pieces of about kPipelineChunkBytes, a second
// thread carrying piece i across the hosts while this one works on piece
// i + 1 in shared memory (the all-reduce: 1.5x the flat ring on link-bound
// 2 Gbit/s links, against 1.3x with the phases in turn). Each UCP worker is progressed by one thread at a time: the
// design tried first, both threads progressing the caller's one worker,
// hung once with the lane's messages unmatched in UCX.
//
// Thread-safety: as UcxCommunicator (Abort from any thread).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"

namespace cohort::comm {

// Collectives of fewer bytes take the flat group.
inline constexpr size_t kHierarchicalMinBytes = 256 * 1024;
// A larger hierarchical collective runs in pieces of about this size, the
// lane carrying one across the hosts while shared memory works on the next.
inline constexpr size_t kPipelineChunkBytes = 4 << 20;

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
  // (InvalidArgument for kHierarchical then). `bootstrap` is how `context`
  // was made (its kv, key prefix, timeouts, cancellation and network
  // devices; rank and size are ignored): the lane's context is made the same
  // way, its keys under "<key_prefix>lane/<lane_id>/<local index>/", by
  // every member of the group at once. Errors: UcxCommunicator's, and
  // UcxContext::Create's for the lane's context (its failed peer named as a
  // rank of `context`). `piece_bytes`: the pipeline's piece size; 0 runs
  // the phases in turn (one piece: for hosts with fewer cores than ranks,
  // where the lane's thread only competes for them).
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      UcxContext* context, UcxCommunicatorOptions flat, uint16_t local_id, uint16_t lane_id,
      CollectiveAlgorithm algorithm, const UcxContextOptions& bootstrap,
      size_t piece_bytes = kPipelineChunkBytes);

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  int hosts() const { return lane_->size(); }

  // After any failure but InvalidArgument (or Unimplemented) every later
  // call fails the same way: each sub-group is aborted with it.
  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Duration timeout) override {
    return Guarded([&] { return RunAllReduce(data, count, type, op, timeout); });
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank,
                             DataType type, ReduceOp op, absl::Duration timeout) override {
    return Guarded(
        [&] { return RunReduceScatter(input, output, count_per_rank, type, op, timeout); });
  }
  absl::Status ReduceScatterOrdered(const float* input, size_t count, size_t block, float* output,
                                    const std::vector<std::pair<int, int>>& merges,
                                    absl::Duration timeout) override {
    return Guarded(
        [&] { return RunReduceScatterOrdered(input, count, block, output, merges, timeout); });
  }
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank, DataType type,
                         absl::Duration timeout) override {
    return Guarded([&] { return RunAllGather(input, output, count_per_rank, type, timeout); });
  }
  absl::Status AllGatherRanges(void* data, const std::vector<ByteRange>& ranges, uint32_t tag,
                               absl::Duration timeout) override {
    return Guarded([&] { return RunAllGatherRanges(data, ranges, tag, timeout); });
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Duration timeout) override {
    return Guarded([&] { return flat_->Broadcast(data, count, type, root, timeout); });
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return Guarded([&] { return flat_->Send(data, bytes, peer, tag, timeout); });
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    return Guarded([&] { return flat_->Recv(data, bytes, peer, tag, timeout); });
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    return Guarded([&] {
      return flat_->SendRecv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer,
                             tag, timeout);
    });
  }
  absl::Status Barrier(absl::Duration timeout) override {
    return Guarded([&] { return flat_->Barrier(timeout); });
  }
  void Abort(const absl::Status& reason) override;

 private:
  HierarchicalCommunicator(std::unique_ptr<UcxCommunicator> flat,
                           std::unique_ptr<UcxCommunicator> local,
                           std::unique_ptr<UcxContext> lane_context,
                           std::unique_ptr<UcxCommunicator> lane,
                           std::vector<std::vector<int>> hosts, size_t piece_bytes);

  absl::Status RunAllReduce(void* data, size_t count, DataType type, ReduceOp op,
                            absl::Duration timeout);
  // Runs `pieces` pieces through `local`, `lane` and `after` in that order
  // each, `local` and `after` on this thread, `lane` on a second one (for
  // more than one piece), piece i + 1's `local` while piece i is on the
  // lane (hierarchical_pipeline.cc). The first failure aborts the other
  // side and is returned.
  absl::Status RunPieces(size_t pieces, absl::FunctionRef<absl::Status(size_t)> local,
                         absl::FunctionRef<absl::Status(size_t)> lane,
                         absl::FunctionRef<absl::Status(size_t)> after);
  // A lane error with its failed peer (a rank of the lane's context) named
  // as a rank of the caller's context.
  absl::Status LaneError(absl::Status status) const;
  absl::Status RunReduceScatter(const void* input, void* output, size_t count_per_rank,
                                DataType type, ReduceOp op, absl::Duration timeout);
  absl::Status RunReduceScatterOrdered(const float* input, size_t count, size_t block,
                                       float* output,
                                       const std::vector<std::pair<int, int>>& merges,
                                       absl::Duration timeout);
  absl::Status RunAllGather(const void* input, void* output, size_t count_per_rank,
                            DataType type, absl::Duration timeout);
  absl::Status RunAllGatherRanges(void* data, const std::vector<ByteRange>& ranges, uint32_t tag,
                                  absl::Duration timeout);

  // Runs `call` unless an earlier one failed (then: that failure); records
  // a failure (not InvalidArgument, not Unimplemented) and aborts the
  // sub-groups with it.
  template <typename Call>
  absl::Status Guarded(Call&& call) {
    if (absl::Status failed = failure(); !failed.ok()) return failed;
    absl::Status status = call();
    if (!status.ok() && !absl::IsInvalidArgument(status) && !absl::IsUnimplemented(status)) {
      Fail(status);
    }
    return status;
  }
  absl::Status failure() const ABSL_LOCKS_EXCLUDED(failure_mu_) {
    absl::MutexLock lock(&failure_mu_);
    return failure_;
  }
  // Keeps the first failure and aborts every sub-group with it.
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(failure_mu_);

  // The merges split into this host's (local ranks) and the hosts' (lane
  // ranks), or nullopt when they do not fold host by host (see above).
  struct OrderedSplit {
    std::vector<std::pair<int, int>> local, hosts;
  };
  // Every rank's block of `per_block` elements cut in pieces of `sub`
  // elements (about piece_bytes_ of the group's buffer; the whole block when
  // piece_bytes_ is 0): piece p is elements [p sub, p sub + length(p)) of
  // each block.
  struct BlockPieces {
    size_t per_block, sub, count;
    size_t length(size_t p) const { return std::min(sub, per_block - p * sub); }
  };
  // The pieces of blocks of `per_block` elements of `element` bytes; sizes
  // staged_ for one piece of every block and slice_ for this rank's lane
  // share of every piece (hosts() pieces each: piece p's at LaneShare).
  BlockPieces CutBlocks(size_t per_block, size_t element);
  uint8_t* LaneShare(const BlockPieces& pieces, size_t p, size_t element) {
    return slice_.data() + hosts_.size() * p * pieces.sub * element;
  }
  // RunReduceScatterOrdered once the merges split: pieces of every block,
  // each folded on this host and then across the hosts.
  absl::Status RunOrderedPieces(const float* input, size_t count, size_t block, float* output,
                                const OrderedSplit& split, absl::Duration timeout);

  // The time left until a call's deadline.
  class Deadline {
   public:
    explicit Deadline(absl::Duration timeout) : at_(absl::Now() + timeout) {}
    absl::Duration operator()() const {
      return std::max(at_ - absl::Now(), absl::ZeroDuration());
    }

   private:
    const absl::Time at_;
  };

  // The group rank of local rank `local` on host `host`.
  int GroupRank(int host, int local) const { return hosts_[host][local]; }
  // Copy one piece of each of the group's n blocks of `block_bytes`
  // (bytes [offset_bytes, offset_bytes + piece_bytes) of each) between
  // group-rank order (`grouped`, of which the first `valid_bytes` are real)
  // and lane order (`lanes`: the piece of GroupRank(h, l) at l H + h, n
  // whole pieces; ToLanes zeroes past the real bytes).
  void ToLanes(const uint8_t* grouped, size_t valid_bytes, size_t block_bytes, size_t offset_bytes,
               size_t piece_bytes, uint8_t* lanes) const;
  void FromLanes(const uint8_t* lanes, size_t block_bytes, size_t offset_bytes, size_t piece_bytes,
                 size_t valid_bytes, uint8_t* grouped) const;
  std::optional<OrderedSplit> SplitMerges(const std::vector<std::pair<int, int>>& merges) const;
  // An ordered reduce-scatter by direct exchange: `input` holds group's
  // size() pieces of `piece` floats; returns this rank's piece folded by
  // `merges` (in `scratch`, valid until its next use).
  absl::StatusOr<const float*> ExchangeOrdered(UcxCommunicator* group, const float* input,
                                               size_t piece,
                                               const std::vector<std::pair<int, int>>& merges,
                                               const Deadline& left, std::vector<uint8_t>* scratch);

  std::unique_ptr<UcxCommunicator> flat_, local_;
  // The lane's own context; declared before the lane, which it outlives.
  std::unique_ptr<UcxContext> lane_context_;
  std::unique_ptr<UcxCommunicator> lane_;
  std::vector<std::vector<int>> hosts_;  // group ranks by host (layout::RanksByHost)
  int host_ = 0;                         // this rank's host index
  int local_index_ = 0;                  // this rank's index on its host
  const size_t piece_bytes_;             // 0: one piece (no pipeline)
  // Reused across calls: a padded or lane-ordered copy of the buffer, this
  // rank's lane share, and the lane peers' pieces of an ordered reduction.
  // `lane_pieces_` is the lane thread's own.
  std::vector<uint8_t> padded_, staged_, slice_, pieces_, lane_pieces_;
  bool ordered_logged_ = false;
  mutable absl::Mutex failure_mu_;
  absl::Status failure_ ABSL_GUARDED_BY(failure_mu_);
};

}  // namespace cohort::comm
