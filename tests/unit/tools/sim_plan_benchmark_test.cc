#include "gtest/gtest.h"
#include "tools/sim/plan_benchmark.h"

namespace cohort::sim {
namespace {

TEST(TimeMeshPlanningTest, PlansAllWorkers) {
  absl::StatusOr<PlanTiming> timing = TimeMeshPlanning(
      {.workers = 64, .tensor = 8, .pipeline = 1, .workers_per_host = 8, .runs = 3});
  ASSERT_TRUE(timing.ok()) << timing.status();
  EXPECT_EQ(timing->workers, 64);
  EXPECT_EQ(timing->tensor, 8);
  EXPECT_EQ(timing->runs, 3);
  EXPECT_GT(timing->median_ms, 0);
}

TEST(TimeMeshPlanningTest, RejectsSizesThatAreNotWholeGroups) {
  EXPECT_EQ(TimeMeshPlanning({.workers = 60, .tensor = 8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TimeMeshPlanning({.workers = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TimeMeshPlanning({.workers = 16, .runs = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::sim
