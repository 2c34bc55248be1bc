// TrainingSessionOptions::reuse: a session of a later generation takes over
// what fits of an older one's (EngineTrainer, on a re-plan that changes the
// data-parallel degree). What it takes must leave the math as it was: a
// session rebuilt around the model shard, with the optimizer state handed
// over, trains bit for bit as the session that never stopped.

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/training_configs.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

std::unique_ptr<TrainingSession> NewSession(const TrainingConfig& config,
                                            TrainingSession* reuse = nullptr,
                                            bool initialize = true) {
  TrainingSessionOptions options;
  options.num_threads = 1;
  options.reuse = reuse;
  options.initialize_parameters = initialize;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(config, model::ModelLayout{}, {}, options);
  EXPECT_TRUE(session.ok()) << session.status();
  return session.ok() ? *std::move(session) : nullptr;
}

TEST(TrainingSessionReuseTest, ARebuiltSessionTrainsOnTheModelShardAsIfItNeverStopped) {
  // Four micro-batches per step: the gradient accumulation is in use.
  const TrainingConfig config = testing::SmallTrainingConfig(8, 2, 3);
  std::unique_ptr<TrainingSession> straight = NewSession(config);
  std::unique_ptr<TrainingSession> older = NewSession(config);
  ASSERT_NE(straight, nullptr);
  ASSERT_NE(older, nullptr);
  for (int64_t s = 0; s < 2; ++s) {
    ASSERT_TRUE(straight->RunStep(Step(s)).ok());
    ASSERT_TRUE(older->RunStep(Step(s)).ok());
  }

  std::unique_ptr<TrainingSession> newer = NewSession(config, older.get());
  ASSERT_NE(newer, nullptr);
  EXPECT_TRUE(newer->reused_model());
  EXPECT_EQ(newer->model().params(), older->model().params());  // no new weights
  EXPECT_EQ(&newer->sampler(), &older->sampler());
  EXPECT_EQ(&newer->dataset(), &older->dataset());
  // The optimizer state is the new session's own: what a restore fills.
  const size_t n = newer->model().num_params();
  std::memcpy(newer->runner().adam_m(), older->runner().adam_m(), n * sizeof(float));
  std::memcpy(newer->runner().adam_v(), older->runner().adam_v(), n * sizeof(float));

  absl::StatusOr<StepResult> expected = straight->RunStep(Step(2));
  absl::StatusOr<StepResult> got = newer->RunStep(Step(2));
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->loss, expected->loss);
  EXPECT_EQ(got->grad_norm, expected->grad_norm);
  EXPECT_EQ(0, std::memcmp(newer->model().params(), straight->model().params(), n * sizeof(float)));

  // The older session lent its gradient accumulation; should it train
  // again (a worker's does when the newer one's generation fails to start,
  // and a later one keeps it) it allocates another.
  newer.reset();
  EXPECT_TRUE(older->RunStep(Step(3)).ok());
}

TEST(TrainingSessionReuseTest, ASessionHoldingNoStateLendsItsStateBuffersToo) {
  // A warm spare's session holds no state: a session for another data rank
  // built around it takes its moments (and version buffers) too.
  const TrainingConfig config = testing::SmallTrainingConfig(8, 2, 3);
  std::unique_ptr<TrainingSession> warm = NewSession(config, nullptr, /*initialize=*/false);
  ASSERT_NE(warm, nullptr);
  warm->Reserve();
  EXPECT_LT(warm->runner().versions().newest(), 0);
  const float* moments = warm->runner().adam_m();
  std::unique_ptr<TrainingSession> taken = NewSession(config, warm.get(), /*initialize=*/false);
  ASSERT_NE(taken, nullptr);
  EXPECT_TRUE(taken->reused_model());
  EXPECT_EQ(taken->runner().adam_m(), moments);

  // A session that holds state keeps its own.
  std::unique_ptr<TrainingSession> holder = NewSession(config);
  ASSERT_NE(holder, nullptr);
  std::unique_ptr<TrainingSession> beside = NewSession(config, holder.get(), /*initialize=*/false);
  ASSERT_NE(beside, nullptr);
  EXPECT_TRUE(beside->reused_model());
  EXPECT_NE(beside->runner().adam_m(), holder->runner().adam_m());
}

TEST(TrainingSessionReuseTest, OnlyWhatFitsIsTakenOver) {
  const TrainingConfig config = testing::SmallTrainingConfig(8, 2, 3);
  std::unique_ptr<TrainingSession> older = NewSession(config);
  ASSERT_NE(older, nullptr);

  // Larger micro-batches need larger activations: a new model shard, the
  // same data pipeline.
  TrainingConfig wider = config;
  wider.micro_batch_size = 4;
  std::unique_ptr<TrainingSession> rebuilt = NewSession(wider, older.get());
  ASSERT_NE(rebuilt, nullptr);
  EXPECT_FALSE(rebuilt->reused_model());
  EXPECT_NE(rebuilt->model().params(), older->model().params());
  EXPECT_EQ(&rebuilt->sampler(), &older->sampler());

  // Another batch: the same tokens, another sampler.
  TrainingConfig larger = config;
  larger.global_batch_size = 16;
  std::unique_ptr<TrainingSession> resampled = NewSession(larger, older.get());
  ASSERT_NE(resampled, nullptr);
  EXPECT_TRUE(resampled->reused_model());
  EXPECT_EQ(&resampled->dataset(), &older->dataset());
  EXPECT_NE(&resampled->sampler(), &older->sampler());

  // Another data source: nothing of the data pipeline.
  TrainingConfig other = config;
  other.data.sample_seed += 1;
  std::unique_ptr<TrainingSession> fresh = NewSession(other, older.get());
  ASSERT_NE(fresh, nullptr);
  EXPECT_NE(&fresh->dataset(), &older->dataset());
  EXPECT_NE(&fresh->sampler(), &older->sampler());

  // Another model: a model shard of its own.
  TrainingConfig deeper = config;
  deeper.model.layers = 3;
  std::unique_ptr<TrainingSession> own = NewSession(deeper, older.get());
  ASSERT_NE(own, nullptr);
  EXPECT_FALSE(own->reused_model());
  EXPECT_EQ(&own->dataset(), &older->dataset());
}

}  // namespace
}  // namespace cohort::train
