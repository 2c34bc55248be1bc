#include "worker/train/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace cohort::train {

absl::StatusOr<std::vector<PipelineOp>> OneForwardOneBackwardSchedule(int stages, int stage,
                                                                       int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("1F1B schedule: stage ", stage, " of ", stages,
                                                   " with ", micro_batches, " micro-batches"));
  }
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineOp> ops;
  ops.reserve(2 * static_cast<size_t>(micro_batches));
  int next_forward = 0;
  int next_backward = 0;
  for (; next_forward < warmup; ++next_forward) {
    ops.push_back({PipelineOpKind::kForward, next_forward});
  }
  while (next_forward < micro_batches) {
    ops.push_back({PipelineOpKind::kForward, next_forward++});
    ops.push_back({PipelineOpKind::kBackward, next_backward++});
  }
  while (next_backward < micro_batches) {
    ops.push_back({PipelineOpKind::kBackward, next_backward++});
  }
  return ops;
}

absl::StatusOr<PipelineTimeline> SimulateSchedule(
    const std::vector<std::vector<PipelineOp>>& schedules, int micro_batches,
    double forward_cost, double backward_cost) {
  const int stages = static_cast<int>(schedules.size());
  if (stages < 1 || micro_batches < 1 || !(forward_cost > 0) || !(backward_cost > 0)) {
    return absl::InvalidArgumentError("simulate: need stages, micro-batches and positive costs");
  }
  constexpr double kNotYet = std::numeric_limits<double>::infinity();
  const size_t m = static_cast<size_t>(micro_batches);
  // Finish times of F(s, i) and B(s, i).
  std::vector<std::vector<double>> forward_done(stages, std::vector<double>(m, kNotYet));
  std::vector<std::vector<double>> backward_done(stages, std::vector<double>(m, kNotYet));
  for (int s = 0; s < stages; ++s) {
    std::vector<int> forwards(m, 0), backwards(m, 0);
    for (const PipelineOp& op : schedules[s]) {
      if (op.micro_batch < 0 || op.micro_batch >= micro_batches) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", s, ": micro-batch ", op.micro_batch, " out of range"));
      }
      ++(op.kind == PipelineOpKind::kForward ? forwards : backwards)[op.micro_batch];
    }
    for (size_t i = 0; i < m; ++i) {
      if (forwards[i] != 1 || backwards[i] != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stage ", s, ": micro-batch ", i, " has ", forwards[i], " forwards and ",
            backwards[i], " backwards; expected one of each"));
      }
    }
  }

  PipelineTimeline timeline;
  timeline.busy_time.assign(stages, 0.0);
  timeline.peak_in_flight.assign(stages, 0);
  std::vector<size_t> next(stages, 0);        // next op index per stage
  std::vector<double> stage_free(stages, 0);  // when each stage finishes its last op
  std::vector<int> in_flight(stages, 0);
  size_t remaining = 2 * m * static_cast<size_t>(stages);
  while (remaining > 0) {
    // Start, among the stages whose next op has its inputs, the one that can
    // start earliest (ties: lowest stage), so the result is deterministic.
    int best = -1;
    double best_start = kNotYet;
    for (int s = 0; s < stages; ++s) {
      if (next[s] == schedules[s].size()) continue;
      const PipelineOp& op = schedules[s][next[s]];
      const size_t i = static_cast<size_t>(op.micro_batch);
      double ready;
      if (op.kind == PipelineOpKind::kForward) {
        ready = s == 0 ? 0.0 : forward_done[s - 1][i];
      } else {
        ready = std::max(forward_done[s][i], s + 1 == stages ? 0.0 : backward_done[s + 1][i]);
      }
      const double start = std::max(ready, stage_free[s]);
      if (start < best_start) {
        best_start = start;
        best = s;
      }
    }
    if (best < 0) {
      return absl::InvalidArgumentError("the schedule deadlocks: every stage waits for another");
    }
    const PipelineOp& op = schedules[best][next[best]++];
    const size_t i = static_cast<size_t>(op.micro_batch);
    const bool forward = op.kind == PipelineOpKind::kForward;
    const double end = best_start + (forward ? forward_cost : backward_cost);
    (forward ? forward_done : backward_done)[best][i] = end;
    stage_free[best] = end;
    timeline.busy_time[best] += forward ? forward_cost : backward_cost;
    in_flight[best] += forward ? 1 : -1;
    timeline.peak_in_flight[best] = std::max(timeline.peak_in_flight[best], in_flight[best]);
    timeline.total_time = std::max(timeline.total_time, end);
    --remaining;
  }
  const double busiest = *std::max_element(timeline.busy_time.begin(), timeline.busy_time.end());
  timeline.bubble_fraction = 1.0 - busiest / timeline.total_time;
  return timeline;
}

}  // namespace cohort::train
