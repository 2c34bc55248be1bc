// TrainingSession::EstimateBytes bounds a warm spare's memory before it
// builds anything (EngineTrainer, --warm_spare_memory): it must match what a
// built and Reserve()d session really holds. Measured as the growth of this
// process's resident memory across the build (a fresh test process: every
// large buffer is new pages).

#include <cstdint>
#include <memory>

#include "common/process_info.h"
#include "gtest/gtest.h"
#include "tests/testing/training_configs.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

TEST(SessionMemoryTest, TheEstimateIsWhatABuiltSessionHolds) {
  // About 150 MB: large enough that allocator slack and the binary's own
  // pages are noise.
  TrainingConfig config = testing::SmallTrainingConfig(/*global_batch=*/8, /*micro_batch=*/4,
                                                       /*steps=*/1);
  config.model.layers = 4;
  config.model.heads = 8;
  config.model.width = 384;
  config.model.vocab_size = 8192;
  config.model.context_length = 128;
  config.data.markov.vocab_size = config.model.vocab_size;
  TrainingSessionOptions options;
  options.num_threads = 1;
  options.state_versions.keep_previous = true;
  options.initialize_parameters = false;
  absl::StatusOr<uint64_t> estimate =
      TrainingSession::EstimateBytes(config, model::ModelLayout{}, 1, 0, options);
  ASSERT_TRUE(estimate.ok()) << estimate.status();

  const int64_t before = ResidentMemoryBytes();
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(config, model::ModelLayout{}, {}, options);
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->Reserve();
  const int64_t grown = ResidentMemoryBytes() - before;
  ASSERT_GT(grown, 100 << 20);
  const double ratio = static_cast<double>(*estimate) / static_cast<double>(grown);
  EXPECT_GT(ratio, 0.9) << "estimate " << *estimate << " bytes, resident growth " << grown;
  EXPECT_LT(ratio, 1.1) << "estimate " << *estimate << " bytes, resident growth " << grown;
}

}  // namespace
}  // namespace cohort::train
