#include "worker/train/pipeline_schedule.h"

#include <vector>

#include "gtest/gtest.h"

namespace cohort::train {
namespace {

using Kind = PipelineOpKind;

std::vector<std::vector<PipelineOp>> AllStages(int p, int m) {
  std::vector<std::vector<PipelineOp>> schedules;
  for (int s = 0; s < p; ++s) {
    absl::StatusOr<std::vector<PipelineOp>> ops = OneForwardOneBackwardSchedule(p, s, m);
    EXPECT_TRUE(ops.ok()) << ops.status();
    schedules.push_back(*ops);
  }
  return schedules;
}

TEST(PipelineScheduleTest, FourStagesEightMicroBatchesMatchTheTextbookOrder) {
  absl::StatusOr<std::vector<PipelineOp>> first = OneForwardOneBackwardSchedule(4, 0, 8);
  ASSERT_TRUE(first.ok());
  // Stage 0: 3 warm-up forwards, then F/B pairs, then 3 cool-down backwards.
  const std::vector<PipelineOp> expected_first = {
      {Kind::kForward, 0},  {Kind::kForward, 1},  {Kind::kForward, 2},  {Kind::kForward, 3},
      {Kind::kBackward, 0}, {Kind::kForward, 4},  {Kind::kBackward, 1}, {Kind::kForward, 5},
      {Kind::kBackward, 2}, {Kind::kForward, 6},  {Kind::kBackward, 3}, {Kind::kForward, 7},
      {Kind::kBackward, 4}, {Kind::kBackward, 5}, {Kind::kBackward, 6}, {Kind::kBackward, 7}};
  EXPECT_EQ(*first, expected_first);
  absl::StatusOr<std::vector<PipelineOp>> last = OneForwardOneBackwardSchedule(4, 3, 8);
  ASSERT_TRUE(last.ok());
  // The last stage has no warm-up: strictly F0 B0 F1 B1 ...
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ((*last)[2 * i], (PipelineOp{Kind::kForward, i}));
    EXPECT_EQ((*last)[2 * i + 1], (PipelineOp{Kind::kBackward, i}));
  }
}

class PipelineShapeTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(PipelineShapeTest, OrderMemoryAndBubble) {
  const auto [p, m] = GetParam();
  const auto schedules = AllStages(p, m);
  for (int s = 0; s < p; ++s) {
    std::vector<int> forward_at(m, -1), backward_at(m, -1);
    int in_flight = 0, peak = 0, last_backward = -1;
    for (size_t k = 0; k < schedules[s].size(); ++k) {
      const PipelineOp& op = schedules[s][k];
      if (op.kind == Kind::kForward) {
        forward_at[op.micro_batch] = static_cast<int>(k);
        peak = std::max(peak, ++in_flight);
      } else {
        backward_at[op.micro_batch] = static_cast<int>(k);
        --in_flight;
        // Backwards in ascending micro-batch order: the accumulation order
        // of a single process.
        EXPECT_EQ(op.micro_batch, last_backward + 1);
        last_backward = op.micro_batch;
      }
    }
    for (int i = 0; i < m; ++i) {
      ASSERT_GE(forward_at[i], 0) << "stage " << s << " never runs F" << i;
      EXPECT_LT(forward_at[i], backward_at[i]) << "stage " << s << " micro-batch " << i;
    }
    EXPECT_LE(peak, p - s) << "stage " << s;
    EXPECT_EQ(peak, std::min(p - s, m)) << "stage " << s;
  }
  // Unit costs and a backward twice a forward: the bubble is (p-1)/(m+p-1)
  // either way.
  for (double backward_cost : {1.0, 2.0}) {
    absl::StatusOr<PipelineTimeline> timeline = SimulateSchedule(schedules, m, 1.0, backward_cost);
    ASSERT_TRUE(timeline.ok()) << timeline.status();
    EXPECT_NEAR(timeline->total_time, (m + p - 1) * (1.0 + backward_cost), 1e-9);
    EXPECT_NEAR(timeline->bubble_fraction, static_cast<double>(p - 1) / (m + p - 1), 1e-12)
        << "p=" << p << " m=" << m;
    for (int s = 0; s < p; ++s) EXPECT_LE(timeline->peak_in_flight[s], p - s);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PipelineShapeTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(1, 2, 4, 7, 8, 16)));

TEST(PipelineScheduleTest, SimulationRejectsDeadlocksAndIncompleteSchedules) {
  // Stage 0 waits for B0 before it ever runs F0's successor... and stage 1
  // runs its backward before the forward it needs.
  std::vector<std::vector<PipelineOp>> bad = {
      {{Kind::kForward, 0}, {Kind::kBackward, 0}},
      {{Kind::kBackward, 0}, {Kind::kForward, 0}}};
  EXPECT_TRUE(absl::IsInvalidArgument(SimulateSchedule(bad, 1, 1, 1).status()));
  std::vector<std::vector<PipelineOp>> missing = {{{Kind::kForward, 0}}};
  EXPECT_TRUE(absl::IsInvalidArgument(SimulateSchedule(missing, 1, 1, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(OneForwardOneBackwardSchedule(2, 2, 4).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(OneForwardOneBackwardSchedule(2, 0, 0).status()));
}

TEST(PipelineScheduleTest, GPipeOrderNeedsAllActivationsAndHasTheSameBubble) {
  // For contrast: all forwards then all backwards is valid, keeps m alive.
  const int p = 4, m = 8;
  std::vector<std::vector<PipelineOp>> gpipe(p);
  for (int s = 0; s < p; ++s) {
    for (int i = 0; i < m; ++i) gpipe[s].push_back({Kind::kForward, i});
    for (int i = 0; i < m; ++i) gpipe[s].push_back({Kind::kBackward, i});
  }
  absl::StatusOr<PipelineTimeline> timeline = SimulateSchedule(gpipe, m, 1, 2);
  ASSERT_TRUE(timeline.ok()) << timeline.status();
  EXPECT_EQ(timeline->peak_in_flight[0], m);
  EXPECT_NEAR(timeline->bubble_fraction, 3.0 / 11.0, 1e-12);
}

}  // namespace
}  // namespace cohort::train
