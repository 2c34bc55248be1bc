#pragma once
// DataParallel: the data-parallel side of a training step over one data
// group Communicator, with optional ZeRO-1 optimizer-state sharding.
//
// Each rank holds the full parameters and accumulates the gradient of its
// share of the global batch (loss scale 1 / (micro-batches * dp), so the sum
// over ranks is the gradient of the global mean loss). Then:
//
//   plain:   ReduceGradients all-reduces (sums) the whole gradient; every
//            rank updates every parameter; GatherParameters is a no-op.
//   ZeRO-1:  ReduceGradients reduce-scatters the gradient, so each rank ends
//            with the summed gradient of its own shard only; the rank keeps
//            optimizer state for, and updates, that shard; GatherParameters
//            all-gathers the updated shards into every rank's parameters.
//
// Shards. The flat parameter count n is padded to a multiple of
// dp * kNormChunk and cut into dp equal shards, so shard boundaries fall on
// the fixed chunks over which the gradient norm is summed (grad_norm_plan.h).
// The padding is zero, takes part in the collectives and is never read back.
//
// Determinism. The default (deterministic) reduction sums the gradient of
// the global batch in one fixed tree over the step's micro-batches
// (reduction_tree.h): each rank folds its own micro-batches (GradientTree)
// and ReduceGradientTree combines every rank's nodes (TreeReducer), so the
// sum has the same bits for every data-parallel degree, every split of the
// micro-batches over ranks, ZeRO-1 or not, and every transport. The
// transport's reduction (deterministic = false) sums each rank's local sum
// in the communicator's own order: reproducible for a given dp only.
//
// Thread-compatible: one step at a time.

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/layout/mesh_layout.h"
#include "worker/comm/communicator.h"
#include "worker/train/grad_norm.h"
#include "worker/train/tree_reducer.h"

namespace cohort::train {

inline constexpr size_t kNormChunk = kSumOfSquaresChunk;
// The shard math lives in the layout library (layout::DataShardRange: the
// update range under ZeRO-1, and the range a data rank writes to checkpoints
// either way); its alignment must be the norm's chunk.
static_assert(kNormChunk == layout::kShardAlignment);

// Up to this many floats (64 MiB) the deterministic reduction without
// ZeRO-1 keeps a padded copy of the gradient so the communicator's
// all-gather can fill it; above, it gathers in place, pairwise.
inline constexpr size_t kSmallGradientFloats = size_t{16} << 20;

struct DataParallelOptions {
  bool zero1 = false;
  // Bound on every collective of a step.
  absl::Duration timeout = absl::Minutes(5);
  // The fixed-tree reduction (above) over the step's micro-batches, which
  // the data ranks train `micro_batch_shares` of (data-rank order, one entry
  // per rank: TrainingConfig::shares(), the plan's split).
  bool deterministic = true;
  std::vector<int> micro_batch_shares = {1};
  int num_threads = 0;  // OpenMP threads of the tree's additions; 0 = all
};

class DataParallel {
 public:
  // `group` is the data group (nullptr or size 1: a single replica, where
  // every call is local). `num_params` is the flat parameter count.
  // `group` must outlive this object.
  DataParallel(comm::Communicator* group, size_t num_params, DataParallelOptions options);

  int dp() const { return dp_; }
  int rank() const { return rank_; }
  bool zero1() const { return options_.zero1; }
  // The flat range [update_begin, update_end) this rank updates: its shard
  // (clipped to num_params) under ZeRO-1, everything otherwise.
  size_t update_begin() const { return update_begin_; }
  size_t update_end() const { return update_end_; }
  size_t shard_size() const { return shard_; }
  // The data group (null with a single replica).
  comm::Communicator* group() const { return group_; }
  bool deterministic() const { return options_.deterministic; }
  // The step's micro-batches: the sum of the shares.
  int micro_batches() const { return micro_batches_; }
  // Every rank's micro-batches (leaves of the reduction tree), and this one's.
  const std::vector<LeafRange>& leaf_ranges() const { return reducer_.ranges(); }
  const LeafRange& leaf_range() const { return reducer_.ranges()[rank_]; }

  // The deterministic reduction: `nodes` are this rank's GradientTree nodes
  // (num_params floats each). Returns the summed gradient, in place in
  // nodes[0] (valid on [update_begin, update_end) and on `replicated` under
  // ZeRO-1, everywhere otherwise; the other nodes' own-range slices are
  // overwritten). Errors: the communicator's.
  absl::StatusOr<float*> ReduceGradientTree(const std::vector<float*>& nodes,
                                            layout::ShardRange replicated = {});

  // The transport's reduction: sums `grads` (num_params floats) over the
  // group. Under ZeRO-1 only [update_begin, update_end) holds the sum
  // afterwards; the rest is stale. Errors: the communicator's.
  absl::Status ReduceGradients(float* grads);
  // Sums one value over the group (loss, token counts).
  absl::StatusOr<double> Sum(double value);
  // Sums `values` element-wise over the group, in place.
  absl::Status SumInPlace(std::vector<double>* values);
  // Under ZeRO-1 makes every rank's `params` whole again from the shards the
  // ranks updated; a no-op otherwise.
  absl::Status GatherParameters(float* params);

 private:
  comm::Communicator* const group_;
  const size_t num_params_;
  const DataParallelOptions options_;
  const int dp_;
  const int rank_;
  const int micro_batches_;
  size_t padded_ = 0;
  size_t shard_ = 0;
  size_t update_begin_ = 0;
  size_t update_end_ = 0;
  // Allocated once: ZeRO-1's staging of the padded gradient (the
  // transport's reduction); the deterministic reduction's result for small
  // gradients without ZeRO-1.
  std::vector<float> padded_buffer_;
  std::vector<float> shard_buffer_;  // the transport's ZeRO-1 reduce-scatter
  std::vector<layout::ShardRange> owners_;  // every rank's shard, clipped
  TreeReducer reducer_;
  // With one tree node per rank, the ranks' order of additions, for the
  // communicator's ReduceScatterOrdered (empty otherwise).
  std::vector<std::pair<int, int>> rank_merges_;
  // The group said it has no ordered reduce-scatter: the reducer's
  // pairwise exchange from then on.
  bool ordered_unavailable_ = false;

  // The deterministic reduce-scatter into out[owners_[rank_]].
  absl::Status ReduceScatterTree(const std::vector<float*>& nodes, float* out);
};

}  // namespace cohort::train
