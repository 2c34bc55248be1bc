// Validation (StepRunner::Evaluate through TrainingSession::Validate): the
// validation loss is the mean over the fixed held-out batches of each
// batch's tree of micro-batch losses, it leaves the training state alone,
// and every layout computes the same bits: data-parallel degrees with even
// and uneven splits, a pipeline, both, and tensor parallelism against a
// tolerance (its matmuls split the sums, so bits may differ).

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/thread_ranks.h"
#include "tests/testing/training_configs.h"
#include "worker/data/validation_sampler.h"
#include "worker/model/model_layout.h"
#include "worker/train/reduction_tree.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

constexpr int kBatches = 3;

// 6 micro-batches of 2 sequences per step; the tail 20% of the synthetic
// corpus held out.
TrainingConfig ValidatedConfig() {
  TrainingConfig config = testing::SmallTrainingConfig(12, 2, 4);
  config.data.held_out_fraction = 0.2;
  config.validation_interval = 2;
  config.validation_batches = kBatches;
  return config;
}

std::unique_ptr<TrainingSession> SingleProcess(const TrainingConfig& config) {
  TrainingSessionOptions options;
  options.num_threads = 1;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(config, model::ModelLayout{}, {}, options);
  EXPECT_TRUE(session.ok()) << session.status();
  return session.ok() ? *std::move(session) : nullptr;
}

TEST(ValidationTest, TheLossIsTheMeanOfEachBatchsTreeOfMicroBatchLosses) {
  const TrainingConfig config = ValidatedConfig();
  std::unique_ptr<TrainingSession> session = SingleProcess(config);
  ASSERT_NE(session, nullptr);
  // The reference: the same held-out windows forwarded one micro-batch at a
  // time by the same model.
  absl::StatusOr<Datasets> datasets = LoadDatasets(config.data);
  ASSERT_TRUE(datasets.ok()) << datasets.status();
  ASSERT_NE(datasets->validation, nullptr);
  absl::StatusOr<data::ValidationSampler> sampler = data::ValidationSampler::Create(
      *datasets->validation, {.context_length = config.model.context_length,
                              .global_batch_size = config.global_batch_size,
                              .batches = kBatches});
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  const int B = config.micro_batch_size, T = config.model.context_length;
  const int m = config.micro_batches_per_step();
  std::vector<int32_t> inputs(B * T), targets(B * T);
  double expected = 0;
  for (int b = 0; b < kBatches; ++b) {
    std::vector<double> losses;
    for (int i = 0; i < m; ++i) {
      ASSERT_TRUE(sampler->Fill(b, i * B, B, inputs.data(), targets.data()).ok());
      absl::StatusOr<double> loss =
          session->model().ForwardStage(0, inputs.data(), targets.data(), B, T);
      ASSERT_TRUE(loss.ok()) << loss.status();
      losses.push_back(*loss);
    }
    expected += TreeSum(losses.data(), m) / m;
  }
  expected /= kBatches;
  absl::StatusOr<double> validation = session->Validate();
  ASSERT_TRUE(validation.ok()) << validation.status();
  EXPECT_EQ(*validation, expected);
  // An untrained model over 64 tokens: about ln(64).
  EXPECT_NEAR(*validation, std::log(64.0), 0.5);
}

TEST(ValidationTest, ValidatingLeavesTheTrainingRunAsItWas) {
  const TrainingConfig config = ValidatedConfig();
  std::unique_ptr<TrainingSession> plain = SingleProcess(config);
  std::unique_ptr<TrainingSession> validated = SingleProcess(config);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(validated, nullptr);
  const size_t n = plain->model().num_params();
  for (int s = 0; s < 3; ++s) {
    absl::StatusOr<double> before = validated->Validate();
    ASSERT_TRUE(before.ok()) << before.status();
    ASSERT_EQ(std::memcmp(plain->model().params(), validated->model().params(), n * 4), 0);
    absl::StatusOr<StepResult> a = plain->RunStep(Step(s));
    absl::StatusOr<StepResult> b = validated->RunStep(Step(s));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->loss, b->loss) << "step " << s;
    absl::StatusOr<double> again = validated->Validate();
    ASSERT_TRUE(again.ok());
    EXPECT_NE(*again, *before) << "validation after step " << s << " sees the trained weights";
  }
  EXPECT_EQ(std::memcmp(plain->model().params(), validated->model().params(), n * 4), 0);
}

TEST(ValidationTest, TheValidationDataIsNeverTrainedOn) {
  const TrainingConfig config = ValidatedConfig();
  absl::StatusOr<Datasets> datasets = LoadDatasets(config.data);
  ASSERT_TRUE(datasets.ok()) << datasets.status();
  TrainingConfig whole = config;
  whole.data.held_out_fraction = 0;
  absl::StatusOr<Datasets> all = LoadDatasets(whole.data);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->validation, nullptr);
  EXPECT_EQ(datasets->train->total_tokens() + datasets->validation->total_tokens(),
            all->train->total_tokens());
  EXPECT_EQ(datasets->validation->total_tokens(), config.data.synthetic_tokens / 5);
  // The training set ends where the held-out tail begins.
  const std::span<const uint16_t> corpus = all->train->shard(0);
  const std::span<const uint16_t> kept = datasets->train->shard(0);
  const std::span<const uint16_t> held = datasets->validation->shard(0);
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), corpus.begin()));
  EXPECT_TRUE(std::equal(held.begin(), held.end(), corpus.begin() + kept.size()));
}

using Layout = layout::MeshShape;

// Validate on every rank of `layout` (threads over in-process groups);
// returns each rank's result.
std::vector<double> ValidateIn(TrainingConfig config, Layout layout) {
  std::vector<double> results(static_cast<size_t>(layout.world()), -1);
  // The layout's plan: the step's micro-batches over its data ranks.
  config.micro_batch_shares =
      layout::MicroBatchShares(config.micro_batches_per_step(), layout.data);
  testing::RunRanksInThreads(layout, [&](const testing::ThreadRank& rank) {
    TrainingSessionOptions options;
    options.num_threads = 1;
    options.collective_timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<TrainingSession>> session =
        TrainingSession::Create(config, rank.model_layout, rank.groups, options);
    ASSERT_TRUE(session.ok()) << session.status();
    absl::StatusOr<double> loss = (*session)->Validate();
    ASSERT_TRUE(loss.ok()) << loss.status();
    results[static_cast<size_t>(rank.rank)] = *loss;
  });
  return results;
}

TEST(ValidationTest, EveryDataAndPipelineLayoutComputesTheSameBits) {
  const TrainingConfig config = ValidatedConfig();
  std::unique_ptr<TrainingSession> single = SingleProcess(config);
  ASSERT_NE(single, nullptr);
  absl::StatusOr<double> reference = single->Validate();
  ASSERT_TRUE(reference.ok()) << reference.status();
  // dp 4 splits the 6 micro-batches 2, 2, 1, 1.
  for (const Layout layout : {Layout{.data = 2}, Layout{.data = 4}, Layout{.pipeline = 2},
                              Layout{.data = 3, .pipeline = 2}}) {
    SCOPED_TRACE(absl::StrCat("dp ", layout.data, " pp ", layout.pipeline));
    for (const double loss : ValidateIn(config, layout)) EXPECT_EQ(loss, *reference);
  }
}

TEST(ValidationTest, TensorParallelRanksAgreeWithTheSingleProcessWithinRounding) {
  const TrainingConfig config = ValidatedConfig();
  std::unique_ptr<TrainingSession> single = SingleProcess(config);
  ASSERT_NE(single, nullptr);
  absl::StatusOr<double> reference = single->Validate();
  ASSERT_TRUE(reference.ok());
  const std::vector<double> losses = ValidateIn(config, Layout{.data = 2, .tensor = 2});
  for (const double loss : losses) {
    EXPECT_EQ(loss, losses[0]) << "every rank reports the same loss";
    EXPECT_NEAR(loss, *reference, 1e-5 * *reference);
  }
}

TEST(ValidationTest, TooLittleHeldOutDataIsRefusedNamingTheField) {
  TrainingConfig config = ValidatedConfig();
  config.validation_batches = 1000;
  TrainingSessionOptions options;
  options.num_threads = 1;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(config, model::ModelLayout{}, {}, options);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(session.status().message().find("data.validation"), std::string::npos)
      << session.status();
}

}  // namespace
}  // namespace cohort::train
