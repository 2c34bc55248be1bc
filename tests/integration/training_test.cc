// End to end: the demo job (deploy/local/jobs/demo.yaml: a tiny GPT on the
// synthetic order-1 Markov source, data parallel with ZeRO-1) submitted with
// cohortctl to 4 real workers completes, and its loss reaches the source's
// entropy floor ln(4) + 0.1 nats; each worker reports it in /metrics.

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"

namespace cohort::testing {
namespace {

TEST(TrainingTest, DemoJobOnFourWorkersReachesTheEntropyFloor) {
  LocalCluster cluster("train");
  cluster.StartCoordinator();
  for (int i = 0; i < 4; ++i) {
    ASSERT_NE(cluster.StartWorker(absl::StrCat("w", i), "host", i, "engine"), nullptr);
  }
  cluster.WaitForIdleWorkers(4);
  absl::StatusOr<CommandResult> submitted = RunCommand(
      BinaryPath("cohortctl"),
      {absl::StrCat("--coordinator=", cluster.address()), "submit",
       absl::StrCat(COHORT_SOURCE_DIR, "/deploy/local/jobs/demo.yaml"), "--output=json"},
      absl::Seconds(30));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_EQ(submitted->exit_code, 0) << submitted->output;
  const std::string job_id = "demo-1";
  ASSERT_THAT(submitted->output, ::testing::HasSubstr(job_id));

  const v1::Job job = cluster.WaitForJob(
      job_id,
      [](const v1::Job& j) {
        return j.state() == v1::JOB_STATE_COMPLETED || j.state() == v1::JOB_STATE_FAILED;
      },
      absl::Seconds(150), "the demo job to finish");
  ASSERT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.message();
  EXPECT_EQ(job.mesh().data_parallel(), 4);
  EXPECT_EQ(job.progress().step(), job.spec().steps());
  const double floor = std::log(4.0);
  std::printf("final loss %.4f, entropy floor %.4f, gap %.4f, %.0f tokens/s\n",
              job.progress().loss(), floor, job.progress().loss() - floor,
              job.progress().tokens_per_second());
  EXPECT_LE(job.progress().loss(), floor + 0.1);
  EXPECT_GE(job.progress().loss(), floor - 0.05) << "below the entropy floor: not learning this source";
}

}  // namespace
}  // namespace cohort::testing
