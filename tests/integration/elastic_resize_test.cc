// The deterministic reduction end to end (issue 26): a job whose data-
// parallel degree changes again and again while it trains (a kill without a
// spare, the worker's return, a scale up and back down) computes exactly
// what a job that never changed computes: every step's loss and the final
// checkpoint's weights and AdamW moments bitwise equal to the fault-free
// run's. Tensor and pipeline degrees stay fixed (they are part of the math).
//
//   dp 4 -> 3 (a rank killed, no spare: the survivors share the 8
//   micro-batches 3 + 3 + 2) -> 4 (the worker comes back) -> 8 (scaled up)
//   -> 4 (scaled back), ZeRO-1;
//   dp 2 x tp 2 x pp 2 -> dp 1 (a rank killed) -> dp 2 (it comes back).

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"

namespace cohort::testing {
namespace {

// Waits until the job runs a mesh of `dp` data ranks (every member ready)
// and has passed `step`.
v1::Job WaitForDegree(LocalCluster& cluster, const std::string& id, int dp, int workers,
                      int64_t step) {
  return cluster.WaitForJob(
      id,
      [&](const v1::Job& j) {
        return Finished(j) || (LocalCluster::RunningAndReady(j, workers) &&
                               j.mesh().data_parallel() == dp && j.progress().step() >= step);
      },
      absl::Seconds(120), absl::StrCat("dp ", dp, " past step ", step));
}

v1::JobSpec ResizeSpec(const std::string& name, int tensor, int pipeline, int min_workers,
                       int max_workers, int steps) {
  v1::JobSpec spec =
      ElasticSpec(name, tensor, pipeline, min_workers, max_workers, /*zero1=*/true, steps);
  spec.mutable_batch()->set_micro_batch_size(2);  // 8 micro-batches: dp up to 8
  spec.mutable_checkpoint()->set_interval_steps(steps);  // one checkpoint, after the last step
  spec.mutable_checkpoint()->set_keep_last(1);
  return spec;
}

class ElasticResizeTest : public ElasticTest {};

TEST_F(ElasticResizeTest, FourToThreeToFourToEightToFourIsBitwiseTheFixedRun) {
  constexpr int kSteps = 90;
  StartCluster(4);
  const v1::JobSpec spec = ResizeSpec("resize", 1, 1, 2, 4, kSteps);
  const FixedRun reference = ReferenceWithCheckpoint(spec);

  const std::string id = SubmitJob(spec);
  const v1::Job dp4 = WaitForDegree(cluster_, id, 4, 4, 8);
  ASSERT_FALSE(Finished(dp4)) << Logs();
  Member(dp4, 1)->Kill();
  const v1::Job dp3 = WaitForDegree(cluster_, id, 3, 3, dp4.progress().step() + 5);
  ASSERT_FALSE(Finished(dp3)) << "the job ended before it grew back";
  EXPECT_EQ(std::vector<int>(dp3.mesh().micro_batches().begin(), dp3.mesh().micro_batches().end()),
            (std::vector<int>{3, 3, 2}));
  StartWorker(4);  // the lost worker returns (a new process)
  const v1::Job back = WaitForDegree(cluster_, id, 4, 4, dp3.progress().step() + 5);
  ASSERT_FALSE(Finished(back)) << "the job ended before it was scaled up";
  for (int i = 5; i < 9; ++i) StartWorker(i);
  ASSERT_TRUE(cluster_.Scale(id, 8, 8).ok());
  const v1::Job dp8 = WaitForDegree(cluster_, id, 8, 8, back.progress().step() + 5);
  ASSERT_FALSE(Finished(dp8)) << "the job ended before it was scaled down";
  ASSERT_TRUE(cluster_.Scale(id, 4, 4).ok());
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.mesh().data_parallel(), 4);
  EXPECT_GE(job.generation(), 5u) << "expected 4 re-plans: shrink, grow, scale up, scale down";
  std::printf("generations: %llu; recoveries %d peer, %d checkpoint\n",
              static_cast<unsigned long long>(job.generation()), job.recovery_stats().peer(),
              job.recovery_stats().checkpoint());
  ExpectSameRun("dp 4 -> 3 -> 4 -> 8 -> 4, ZeRO-1", id, reference, kSteps);
}

TEST_F(ElasticResizeTest, TensorAndPipelineStayWhileDataParallelShrinksAndGrows) {
  constexpr int kSteps = 50;
  StartCluster(8);
  const v1::JobSpec spec = ResizeSpec("resize-3d", 2, 2, 4, 8, kSteps);
  const FixedRun reference = ReferenceWithCheckpoint(spec);

  const std::string id = SubmitJob(spec);
  const v1::Job dp2 = WaitForDegree(cluster_, id, 2, 8, 6);
  ASSERT_FALSE(Finished(dp2)) << Logs();
  Member(dp2, 5)->Kill();
  const v1::Job dp1 = WaitForDegree(cluster_, id, 1, 4, dp2.progress().step() + 4);
  ASSERT_FALSE(Finished(dp1)) << "the job ended before it grew back";
  StartWorker(8);
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.mesh().data_parallel(), 2) << "the returned worker was not taken back";
  ExpectSameRun("dp 2 x tp 2 x pp 2 -> dp 1 -> dp 2, ZeRO-1", id, reference, kSteps);
}

}  // namespace
}  // namespace cohort::testing
