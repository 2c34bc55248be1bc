// The determinism contract across thread counts: training steps and a
// validation compute the same bits whatever OpenMP thread count each rank
// runs with (1 to 4), in one process and in every data and pipeline layout
// whose ranks share a process (threads over in-process groups), against the
// single process at one thread. The same with ranks as separate processes
// is tests/integration/data_parallel_test.cc.
//
// Issue 43: ranks sharing a process each set OpenBLAS's process-wide thread
// count around their products and restored it after, so one rank's restore
// could hand another's products to OpenBLAS's threaded driver, whose Haswell
// and Zen kernels round differently: the loss then differed in its last bits
// in about one run in ten. Each layout here starts with OpenBLAS's count at
// 4, as a process may hold it (its default is one thread per core), and
// CMake runs this test with OPENBLAS_CORETYPE=Haswell so that it can fail on
// any CPU with AVX2.

#include <cblas.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/thread_ranks.h"
#include "tests/testing/training_configs.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

constexpr int kSteps = 3;

// 6 micro-batches of 2 sequences per step, 3 held-out batches.
TrainingConfig Config() {
  TrainingConfig config = testing::SmallTrainingConfig(12, 2, kSteps);
  config.data.held_out_fraction = 0.2;
  config.validation_batches = 3;
  return config;
}

// What a rank computed: each step's loss, then the validation loss.
struct RankRun {
  std::vector<double> losses;
  double validation = -1;
  std::string params;  // the rank's final weights (its shard's)
};

void TrainAndValidate(TrainingSession& session, RankRun& run) {
  for (int s = 0; s < kSteps; ++s) {
    absl::StatusOr<StepResult> step = session.RunStep(Step(s));
    ASSERT_TRUE(step.ok()) << step.status();
    run.losses.push_back(step->loss);
  }
  absl::StatusOr<double> validation = session.Validate();
  ASSERT_TRUE(validation.ok()) << validation.status();
  run.validation = *validation;
  const model::GptModel& model = session.model();
  run.params.assign(reinterpret_cast<const char*>(model.params()), model.num_params() * 4);
}

// `tie_per_step`: the tied embedding's two gradient parts added once per
// step, the order a pipeline adds them in (StepRunnerOptions).
RankRun SingleProcess(int threads, bool tie_per_step = false) {
  TrainingSessionOptions options;
  options.num_threads = threads;
  if (tie_per_step) options.tie_per_micro_batch = false;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(Config(), model::ModelLayout{}, {}, options);
  EXPECT_TRUE(session.ok()) << session.status();
  RankRun run;
  if (session.ok()) TrainAndValidate(**session, run);
  return run;
}

// Every rank of `layout` in this process, rank r with 1 + (r + offset) % 4
// threads.
std::vector<RankRun> RanksInThreads(const layout::MeshShape& layout, int offset) {
  std::vector<RankRun> runs(static_cast<size_t>(layout.world()));
  // The layout's plan: the step's micro-batches over its data ranks.
  TrainingConfig config = Config();
  config.micro_batch_shares =
      layout::MicroBatchShares(config.micro_batches_per_step(), layout.data);
  openblas_set_num_threads(4);
  testing::RunRanksInThreads(layout, [&](const testing::ThreadRank& rank) {
    TrainingSessionOptions options;
    options.num_threads = 1 + (rank.rank + offset) % 4;
    options.collective_timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<TrainingSession>> session =
        TrainingSession::Create(config, rank.model_layout, rank.groups, options);
    ASSERT_TRUE(session.ok()) << session.status();
    TrainAndValidate(**session, runs[static_cast<size_t>(rank.rank)]);
  });
  return runs;
}

TEST(ThreadCountDeterminismTest, OneProcessAtOneToFourThreadsComputesTheSameBits) {
  const RankRun one = SingleProcess(1);
  ASSERT_EQ(one.losses.size(), static_cast<size_t>(kSteps));
  for (int threads = 2; threads <= 4; ++threads) {
    SCOPED_TRACE(absl::StrCat(threads, " threads"));
    const RankRun run = SingleProcess(threads);
    EXPECT_EQ(run.losses, one.losses);
    EXPECT_EQ(run.validation, one.validation);
    EXPECT_TRUE(run.params == one.params) << "the trained weights differ";
  }
}

TEST(ThreadCountDeterminismTest, RanksInOneProcessWithTheirOwnThreadCountsComputeTheSameBits) {
  const RankRun one = SingleProcess(1);
  const RankRun one_tied_per_step = SingleProcess(1, /*tie_per_step=*/true);
  ASSERT_EQ(one.losses.size(), static_cast<size_t>(kSteps));
  // dp 4 splits the 6 micro-batches 2, 2, 1, 1. Each layout twice, with the
  // thread counts shifted across the ranks.
  using Shape = layout::MeshShape;
  for (const Shape layout : {Shape{.data = 2}, Shape{.data = 4}, Shape{.pipeline = 2},
                             Shape{.data = 2, .pipeline = 2}, Shape{.data = 3, .pipeline = 2}}) {
    for (const int offset : {0, 2}) {
      SCOPED_TRACE(
          absl::StrCat("dp ", layout.data, " pp ", layout.pipeline, ", thread offset ", offset));
      const std::vector<RankRun> runs = RanksInThreads(layout, offset);
      // A pipeline adds the tied embedding's parts once per step.
      const RankRun& reference = layout.pipeline > 1 ? one_tied_per_step : one;
      for (size_t r = 0; r < runs.size(); ++r) {
        // Every stage reports the step's loss (the last stage's, passed on)
        // and the validation loss.
        EXPECT_EQ(runs[r].losses, reference.losses) << "rank " << r;
        EXPECT_EQ(runs[r].validation, reference.validation) << "rank " << r;
      }
      // Without pipeline stages every rank holds the whole model.
      if (layout.pipeline == 1) {
        for (size_t r = 0; r < runs.size(); ++r) {
          EXPECT_TRUE(runs[r].params == one.params) << "rank " << r << "'s weights differ";
        }
      }
    }
  }
}

}  // namespace
}  // namespace cohort::train
