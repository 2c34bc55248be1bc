// StepRunner (worker/train/step_runner.h) on the in-memory channel seam:
// the ranks of a data x pipeline mesh as threads, each group an
// InMemoryCommunicator, so the steps run the production collectives (ring
// and direct) and point-to-point exchanges in process. Compared, as the
// integration tests compare processes, with one process: every layout's
// losses, validation loss and weights equal it bit for bit (a pipeline the
// process that adds the tied embedding's parts once per step), with ZeRO-1
// and without; a data peer that died fails the step with an error instead
// of hanging it.

#include "worker/train/step_runner.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/layout/mesh_layout.h"
#include "gtest/gtest.h"
#include "tests/testing/training_configs.h"
#include "worker/comm/in_memory_communicator.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

constexpr int kSteps = 2;

// 6 micro-batches of 2 sequences per step, 2 held-out batches.
TrainingConfig Config(bool zero1) {
  TrainingConfig config = testing::SmallTrainingConfig(12, 2, kSteps);
  config.data.held_out_fraction = 0.2;
  config.validation_batches = 2;
  config.zero1 = zero1;
  return config;
}

struct RankRun {
  absl::Status status;
  std::vector<double> losses;
  double validation = -1;
  std::string params;  // the rank's final weights (its stage's)
};

absl::Status TrainAndValidate(TrainingSession& session, RankRun& run) {
  for (int s = 0; s < kSteps; ++s) {
    absl::StatusOr<StepResult> step = session.runner().Run(Step(s));
    if (!step.ok()) return step.status();
    run.losses.push_back(step->loss);
  }
  absl::StatusOr<double> validation = session.Validate();
  if (!validation.ok()) return validation.status();
  run.validation = *validation;
  const model::GptModel& model = session.model();
  run.params.assign(reinterpret_cast<const char*>(model.params()), model.num_params() * 4);
  return absl::OkStatus();
}

RankRun SingleProcess(bool zero1, bool tie_per_step) {
  TrainingSessionOptions options;
  options.num_threads = 1;
  if (tie_per_step) options.tie_per_micro_batch = false;
  RankRun run;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(Config(zero1), model::ModelLayout{}, {}, options);
  run.status = session.ok() ? TrainAndValidate(**session, run) : session.status();
  return run;
}

// Every rank of a dp x pp mesh as a thread; rank (d, p) at d * pp + p. Each
// stage's data group and each data rank's pipeline group is a fabric of its
// own. `fail_data_rank`: that rank of every data group is dead from the
// start (its threads do not train).
std::vector<RankRun> OnTheSeam(int dp, int pp, bool zero1, int fail_data_rank = -1,
                               absl::Duration timeout = absl::Seconds(60)) {
  TrainingConfig config = Config(zero1);
  config.micro_batch_shares = layout::MicroBatchShares(config.micro_batches_per_step(), dp);
  std::vector<std::unique_ptr<comm::InMemoryFabric>> data, pipeline;
  for (int p = 0; p < pp; ++p) data.push_back(std::make_unique<comm::InMemoryFabric>(dp));
  for (int d = 0; d < dp; ++d) pipeline.push_back(std::make_unique<comm::InMemoryFabric>(pp));
  if (fail_data_rank >= 0) {
    for (auto& fabric : data) fabric->Fail(fail_data_rank);
  }
  std::vector<RankRun> runs(static_cast<size_t>(dp * pp));
  std::vector<std::thread> threads;
  for (int d = 0; d < dp; ++d) {
    for (int p = 0; p < pp; ++p) {
      threads.emplace_back([&, d, p] {
        RankRun& run = runs[static_cast<size_t>(d * pp + p)];
        if (d == fail_data_rank) return;
        comm::InMemoryCommunicator data_group(data[static_cast<size_t>(p)].get(), d);
        comm::InMemoryCommunicator pipeline_group(pipeline[static_cast<size_t>(d)].get(), p);
        TrainingGroups groups;
        groups.data = dp > 1 ? &data_group : nullptr;
        groups.pipeline = pp > 1 ? &pipeline_group : nullptr;
        TrainingSessionOptions options;
        options.num_threads = 1;
        options.collective_timeout = timeout;
        const model::ModelLayout layout{.tp = 1, .tp_rank = 0, .pp = pp, .stage = p};
        absl::StatusOr<std::unique_ptr<TrainingSession>> session =
            TrainingSession::Create(config, layout, groups, options);
        run.status = session.ok() ? TrainAndValidate(**session, run) : session.status();
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
  return runs;
}

TEST(StepRunnerTest, DataParallelRanksComputeTheSingleProcessBits) {
  for (bool zero1 : {false, true}) {
    const RankRun one = SingleProcess(zero1, /*tie_per_step=*/false);
    ASSERT_TRUE(one.status.ok()) << one.status;
    ASSERT_EQ(one.losses.size(), static_cast<size_t>(kSteps));
    // dp 4 splits the 6 micro-batches 2, 2, 1, 1.
    for (int dp : {2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat("dp ", dp, zero1 ? " ZeRO-1" : ""));
      const std::vector<RankRun> runs = OnTheSeam(dp, 1, zero1);
      for (size_t r = 0; r < runs.size(); ++r) {
        ASSERT_TRUE(runs[r].status.ok()) << "rank " << r << ": " << runs[r].status;
        EXPECT_EQ(runs[r].losses, one.losses) << "rank " << r;
        EXPECT_EQ(runs[r].validation, one.validation) << "rank " << r;
        EXPECT_TRUE(runs[r].params == one.params) << "rank " << r << "'s weights differ";
      }
    }
  }
}

TEST(StepRunnerTest, PipelineStagesComputeTheSingleProcessBitsWithTheTiePerStep) {
  const RankRun one = SingleProcess(/*zero1=*/false, /*tie_per_step=*/true);
  ASSERT_TRUE(one.status.ok()) << one.status;
  for (int dp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("dp ", dp, " pp 2"));
    const std::vector<RankRun> runs = OnTheSeam(dp, 2, /*zero1=*/false);
    for (size_t r = 0; r < runs.size(); ++r) {
      ASSERT_TRUE(runs[r].status.ok()) << "rank " << r << ": " << runs[r].status;
      // Every stage reports the step's loss and the validation loss.
      EXPECT_EQ(runs[r].losses, one.losses) << "rank " << r;
      EXPECT_EQ(runs[r].validation, one.validation) << "rank " << r;
    }
  }
}

TEST(StepRunnerTest, ADeadDataPeerFailsTheStepInsteadOfHangingIt) {
  const absl::Duration timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  const std::vector<RankRun> runs = OnTheSeam(2, 1, /*zero1=*/false, /*fail_data_rank=*/1, timeout);
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(5));
  // Rank 0 trains its micro-batches, then its first exchange with rank 1
  // finds it dead.
  EXPECT_TRUE(absl::IsUnavailable(runs[0].status)) << runs[0].status;
  EXPECT_TRUE(runs[0].losses.empty());
}

}  // namespace
}  // namespace cohort::train
