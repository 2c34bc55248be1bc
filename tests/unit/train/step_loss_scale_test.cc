// The step loss is the mean of the micro-batch losses computed in double
// (issue 22): a float 1/m once scaled loss and gradients by m * fl32(1/m),
// 1 + 3e-8 for m = 3, which this test sees.

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/training_configs.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

TEST(StepLossScaleTest, TheStepLossIsTheMeanOfThreeMicroBatchLossesInDouble) {
  const TrainingConfig config = testing::SmallTrainingConfig(6, 2, 1);
  ASSERT_EQ(config.micro_batches_per_step(), 3);
  TrainingSessionOptions options;
  options.num_threads = 1;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(config, model::ModelLayout{}, {}, options);
  ASSERT_TRUE(session.ok()) << session.status();
  TrainingSession& s = **session;
  // The reference: each micro-batch's mean loss from the same model and the
  // same samples, averaged in double.
  const int B = config.micro_batch_size, T = config.model.context_length;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  double sum = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(s.sampler().Fill(Step(0), i * B, B, inputs.data(), targets.data()).ok());
    absl::StatusOr<double> loss = s.model().ForwardStage(0, inputs.data(), targets.data(), B, T);
    ASSERT_TRUE(loss.ok()) << loss.status();
    sum += *loss;
  }
  absl::StatusOr<StepResult> step = s.RunStep(Step(0));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->loss, sum / 3) << "relative error " << (step->loss - sum / 3) / (sum / 3);
}

}  // namespace
}  // namespace cohort::train
