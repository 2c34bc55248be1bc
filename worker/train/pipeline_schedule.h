#pragma once
// Pipeline schedules: which forward and backward passes each pipeline stage
// runs, in what order. Pure logic (no I/O, no threads), so the pipeline
// engine and its tests share one definition.
//
// 1F1B (non-interleaved, as in Megatron and PipeDream-Flush): with p stages
// and m micro-batches, stage s runs
//   warm-up:   min(p - s - 1, m) forwards,
//   steady:    then alternately one forward and one backward until every
//              forward has run,
//   cool-down: the remaining backwards.
// Backwards run in ascending micro-batch order on every stage, so gradient
// accumulation adds micro-batches in the same order as a single process.
// At most p - s micro-batches' activations are alive on stage s (GPipe keeps
// all m). With uniform costs the schedule takes (m + p - 1) * (t_f + t_b), so
// the bubble is (p - 1) / (m + p - 1) of the step on every stage.
//
// SimulateSchedule runs the per-stage op lists against the data dependencies
// (F(s, i) needs F(s-1, i); B(s, i) needs B(s+1, i) and F(s, i)) with given
// costs: it measures the bubble and rejects lists that would deadlock.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace cohort::train {

enum class PipelineOpKind { kForward, kBackward };

struct PipelineOp {
  PipelineOpKind kind = PipelineOpKind::kForward;
  int micro_batch = 0;
  friend bool operator==(const PipelineOp&, const PipelineOp&) = default;
};

// The ops stage `stage` of `stages` runs for `micro_batches` micro-batches,
// in order. InvalidArgument unless stages >= 1, 0 <= stage < stages and
// micro_batches >= 1.
absl::StatusOr<std::vector<PipelineOp>> OneForwardOneBackwardSchedule(int stages, int stage,
                                                                       int micro_batches);

struct PipelineTimeline {
  double total_time = 0;           // from the first op's start to the last op's end
  std::vector<double> busy_time;   // per stage
  std::vector<int> peak_in_flight;  // per stage: most forwards without their backward yet
  // Idle share of the step on the busiest stage: 1 - max(busy) / total.
  double bubble_fraction = 0;
};

// Runs `schedules` (one op list per stage, stage order) with every forward
// costing `forward_cost` and every backward `backward_cost`, each op
// starting as soon as its stage is free and its inputs exist.
// InvalidArgument for non-positive costs, an op list that does not run each
// micro-batch's forward and backward exactly once, or one that deadlocks.
absl::StatusOr<PipelineTimeline> SimulateSchedule(
    const std::vector<std::vector<PipelineOp>>& schedules, int micro_batches,
    double forward_cost, double backward_cost);

}  // namespace cohort::train
