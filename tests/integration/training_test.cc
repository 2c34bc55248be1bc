// End to end: the demo job (deploy/local/jobs/demo.yaml: a tiny GPT on the
// synthetic order-1 Markov source, data parallel with ZeRO-1) submitted with
// cohortctl to 4 real workers completes, and its loss reaches the source's
// entropy floor ln(4) + 0.1 nats; each worker reports it in /metrics.
// The 3D job (deploy/local/jobs/mesh3d.yaml: tensor 2 x pipeline 2 x data 2)
// submitted to 8 workers completes on a dp2 x tp2 x pp2 mesh and learns;
// specs the layout cannot shard are refused at submit, naming the field.

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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
  absl::StatusOr<CommandResult> submitted =
      RunCommand(BinaryPath("cohortctl"),
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
  EXPECT_GE(job.progress().loss(), floor - 0.05)
      << "below the entropy floor: not learning this source";
}

// The text of a job file under deploy/local/jobs.
std::string ReadJobFile(const std::string& name) {
  std::ifstream in(absl::StrCat(COHORT_SOURCE_DIR, "/deploy/local/jobs/", name));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `text` with its one occurrence of `from` replaced by `to`.
std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "\"" << from << "\" not in\n" << text;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

CommandResult Ctl(const LocalCluster& cluster, std::vector<std::string> args) {
  args.insert(args.begin(), absl::StrCat("--coordinator=", cluster.address()));
  absl::StatusOr<CommandResult> result =
      RunCommand(BinaryPath("cohortctl"), args, absl::Seconds(30));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : CommandResult{-1, ""};
}

TEST(TrainingTest, TensorTwoPipelineTwoDataTwoJobOnEightWorkersCompletesAndLearns) {
  LocalCluster cluster("train3d");
  cluster.StartCoordinator();
  constexpr int kWorkers = 8;
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_NE(cluster.StartWorker(absl::StrCat("w", i), "host", i, "engine"), nullptr);
  }
  cluster.WaitForIdleWorkers(kWorkers);
  const CommandResult submitted =
      Ctl(cluster, {"submit", absl::StrCat(COHORT_SOURCE_DIR, "/deploy/local/jobs/mesh3d.yaml"),
                    "--output=json"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string job_id = "mesh3d-1";
  ASSERT_THAT(submitted.output, ::testing::HasSubstr(job_id));

  const absl::Time start = absl::Now();
  const v1::Job job = cluster.WaitForJob(
      job_id,
      [](const v1::Job& j) {
        return j.state() == v1::JOB_STATE_COMPLETED || j.state() == v1::JOB_STATE_FAILED;
      },
      absl::Seconds(120), "the 3D job to finish");
  std::vector<std::string> worker_logs;
  std::string logs;
  for (int i = 0; i < kWorkers; ++i) {
    std::ifstream in(absl::StrCat(cluster.dir(), "/w", i, ".log"));
    std::stringstream text;
    text << in.rdbuf();
    worker_logs.push_back(text.str());
    logs += absl::StrCat("--- w", i, ".log\n", text.str());
  }
  ASSERT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.message() << "\n" << logs;

  // The coordinator planned the 3D mesh: every (data, tensor, pipeline)
  // coordinate once, at the Megatron rank of proto/cohort/v1/job.proto.
  EXPECT_EQ(job.mesh().data_parallel(), 2);
  EXPECT_EQ(job.mesh().tensor_parallel(), 2);
  EXPECT_EQ(job.mesh().pipeline_parallel(), 2);
  ASSERT_EQ(job.mesh().members_size(), kWorkers);
  std::set<std::string> workers;
  for (int r = 0; r < kWorkers; ++r) {
    const v1::MeshCoordinates& c = job.mesh().members(r).coordinates();
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.rank(), c.pipeline() * 2 * 2 + c.data() * 2 + c.tensor()) << c.DebugString();
    workers.insert(job.mesh().members(r).worker_id());
  }
  EXPECT_EQ(workers.size(), static_cast<size_t>(kWorkers));

  EXPECT_EQ(job.progress().step(), job.spec().steps());
  // A model that has not learnt predicts the 64 tokens uniformly: ln(64) =
  // 4.16 nats. Learning which 16 symbols the source uses takes it to ln(16) =
  // 2.77; below that it has learnt successors, towards the floor ln(4) =
  // 1.39 (2.15 after the 60 steps, deterministically).
  const double uniform = std::log(64.0);
  std::printf("3D job: %lld steps in %.1f s, final loss %.4f (uniform %.4f), %.0f tokens/s\n",
              static_cast<long long>(job.progress().step()),
              absl::ToDoubleSeconds(absl::Now() - start), job.progress().loss(), uniform,
              job.progress().tokens_per_second());
  EXPECT_TRUE(std::isfinite(job.progress().loss()));
  EXPECT_LT(job.progress().loss(), std::log(16.0)) << "not learning the successors\n" << logs;
  EXPECT_GT(job.progress().loss(), std::log(4.0) - 0.05) << "below the entropy floor";

  // Every rank trained every step and ends on the same global loss (the last
  // stage's, summed over the data and pipeline groups).
  const std::string last_step =
      absl::StrCat("job ", job_id, " step ", job.spec().steps(), "/", job.spec().steps(), " loss ");
  std::string first_loss;
  for (int i = 0; i < kWorkers; ++i) {
    SCOPED_TRACE(absl::StrCat("w", i));
    const std::string& log = worker_logs[i];
    EXPECT_THAT(log, ::testing::HasSubstr(
                         absl::StrCat("job ", job_id, " finished ", job.spec().steps(), " steps")));
    const size_t at = log.find(last_step);
    ASSERT_NE(at, std::string::npos) << log;
    const size_t begin = at + last_step.size();
    const std::string loss = log.substr(begin, log.find(' ', begin) - begin);
    if (i == 0) first_loss = loss;
    EXPECT_EQ(loss, first_loss);
  }
}

TEST(TrainingTest, SpecsTheLayoutCannotShardAreRefusedAtSubmitNamingTheField) {
  LocalCluster cluster("train3d-bad");
  cluster.StartCoordinator();
  const std::string good = ReadJobFile("mesh3d.yaml");
  ASSERT_THAT(good, ::testing::HasSubstr("name: mesh3d"));
  struct Case {
    std::string name;
    std::string yaml;
    std::vector<std::string> expected;  // substrings of the refusal
  };
  const std::vector<Case> cases = {
      {"tensor-3",
       Replace(good, "tensor: 2", "tensor: 3"),
       {"parallelism.tensor", "tensor parallel 3 does not divide 4 attention heads (model.heads)"}},
      {"pipeline-8",
       Replace(Replace(good, "pipeline: 2", "pipeline: 8"), "min_workers: 8\n  max_workers: 8",
               "min_workers: 16\n  max_workers: 16"),
       {"parallelism.pipeline", "pipeline parallel 8 exceeds 4 layers (model.layers)"}},
      {"replica-4-on-3",
       Replace(good, "min_workers: 8\n  max_workers: 8", "min_workers: 3\n  max_workers: 3"),
       {"elastic.min_workers",
        "3 is fewer than the 4 workers of one model replica (parallelism.tensor x "
        "parallelism.pipeline)"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = absl::StrCat(cluster.dir(), "/", c.name, ".yaml");
    std::ofstream(path) << Replace(c.yaml, "name: mesh3d", "name: " + c.name);
    const CommandResult result = Ctl(cluster, {"submit", path});
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_THAT(result.output, ::testing::HasSubstr("INVALID_ARGUMENT"));
    for (const std::string& expected : c.expected) {
      EXPECT_THAT(result.output, ::testing::HasSubstr(expected));
    }
  }
  // None of them became a job.
  const CommandResult list = Ctl(cluster, {"list"});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  for (const Case& c : cases)
    EXPECT_THAT(list.output, ::testing::Not(::testing::HasSubstr(c.name)));
}

}  // namespace
}  // namespace cohort::testing
