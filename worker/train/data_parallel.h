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
// Determinism. With dp = 2 the summed gradient is a + b on every element
// whichever rank reduces it, so plain and ZeRO-1 runs are bitwise identical.
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

namespace cohort::train {

inline constexpr size_t kNormChunk = kSumOfSquaresChunk;
// The shard math lives in the layout library (layout::DataShardRange: the
// update range under ZeRO-1, and the range a data rank writes to checkpoints
// either way); its alignment must be the norm's chunk.
static_assert(kNormChunk == layout::kShardAlignment);

struct DataParallelOptions {
  bool zero1 = false;
  // Bound on every collective of a step.
  absl::Duration timeout = absl::Minutes(5);
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

  // Sums `grads` (num_params floats) over the group. Under ZeRO-1 only
  // [update_begin, update_end) holds the sum afterwards; the rest is stale.
  // Errors: the communicator's.
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
  size_t padded_ = 0;
  size_t shard_ = 0;
  size_t update_begin_ = 0;
  size_t update_end_ = 0;
  // ZeRO-1 staging, allocated once: the padded gradient and parameters.
  std::vector<float> padded_buffer_;
  std::vector<float> shard_buffer_;
};

}  // namespace cohort::train
