// A step cancelled for a Suspend or Stop (issue 24: the suspension waited for
// the rest of a step's compute, up to a whole step): it returns Aborted
// before the next micro-batch pass or layer, leaves the state as it was, and
// the step run again afterwards gives the bits of a step never cancelled.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/training_configs.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

std::unique_ptr<TrainingSession> NewSession() {
  TrainingSessionOptions options;
  options.num_threads = 1;
  options.state_versions.keep_previous = true;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(testing::SmallTrainingConfig(/*global_batch=*/4, /*micro_batch=*/2,
                                                           /*steps=*/3),
                              model::ModelLayout{}, {}, options);
  EXPECT_TRUE(session.ok()) << session.status();
  return session.ok() ? *std::move(session) : nullptr;
}

std::vector<float> Weights(TrainingSession& s) {
  const float* p = s.model().params();
  return std::vector<float>(p, p + s.model().num_params());
}

TEST(StepCancelTest, ACancelledStepChangesNothingAndTheRetriedStepHasTheSameBits) {
  std::unique_ptr<TrainingSession> plain = NewSession(), cancelled = NewSession();
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(cancelled, nullptr);
  ASSERT_TRUE(plain->RunStep(Step(0)).ok());
  ASSERT_TRUE(cancelled->RunStep(Step(0)).ok());
  absl::StatusOr<StepResult> expected = plain->RunStep(Step(1));
  ASSERT_TRUE(expected.ok()) << expected.status();

  const std::vector<float> before = Weights(*cancelled);
  const int64_t newest = cancelled->runner().versions().newest();
  std::atomic<bool> cancel{true};
  absl::StatusOr<StepResult> aborted = cancelled->RunStep(Step(1), &cancel);
  EXPECT_TRUE(absl::IsAborted(aborted.status())) << aborted.status();
  EXPECT_EQ(Weights(*cancelled), before);
  EXPECT_EQ(cancelled->runner().versions().newest(), newest);

  cancel = false;
  absl::StatusOr<StepResult> retried = cancelled->RunStep(Step(1), &cancel);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->loss, expected->loss);
  EXPECT_EQ(Weights(*cancelled), Weights(*plain));
}

TEST(StepCancelTest, TheModelStopsBeforeItsNextLayerInBothPasses) {
  std::unique_ptr<TrainingSession> session = NewSession();
  ASSERT_NE(session, nullptr);
  model::GptModel& model = session->model();
  const int B = 2, T = 32;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  ASSERT_TRUE(session->sampler().Fill(Step(0), 0, B, inputs.data(), targets.data()).ok());
  std::atomic<bool> cancel{true};
  model.set_cancel(&cancel);
  EXPECT_TRUE(absl::IsAborted(model.ForwardStage(0, inputs.data(), targets.data(), B, T).status()));
  cancel = false;
  ASSERT_TRUE(model.ForwardStage(0, inputs.data(), targets.data(), B, T).ok());
  cancel = true;
  EXPECT_TRUE(absl::IsAborted(model.BackwardStage(0, 0.5)));
  cancel = false;
  model.ZeroGrad();
  EXPECT_TRUE(model.BackwardStage(0, 0.5).ok());
  model.set_cancel(nullptr);
}

}  // namespace
}  // namespace cohort::train
