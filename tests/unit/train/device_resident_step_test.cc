// The device-resident step (step_runner.h, device_resident(); issue 45's
// "on the device, all the time"), run on GuardedBackend: the CPU's
// arithmetic behind memory the host may not touch, so any host access to the
// training state inside a step crashes the test where a GPU would read
// garbage. A single rank's session keeps its weights, gradients and moments
// in backend memory, gives bitwise the unstaged CPU session's losses, norms
// and weights, moves only the tokens, the losses and the norm across per
// step, and hands a consistent state to a host reader (a checkpoint) and
// back (a restore).

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/device_resident_steps.h"
#include "tests/testing/guarded_backend.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

using testing::ExpectSameStep;
using testing::SameBits;

TrainingConfig Config(int steps) { return testing::DeviceResidentConfig(steps); }

std::unique_ptr<TrainingSession> Session(const TrainingConfig& config,
                                         std::shared_ptr<compute::Backend> backend,
                                         bool initialize = true) {
  TrainingSessionOptions options;
  options.num_threads = 1;
  options.backend = std::move(backend);
  options.initialize_parameters = initialize;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(config, model::ModelLayout{}, {}, options);
  CHECK(session.ok()) << session.status();
  return *std::move(session);
}

TEST(DeviceResidentStepTest, TrainsBitwiseLikeTheCpuAndMovesNoStatePerStep) {
  const TrainingConfig config = Config(5);
  auto guarded = std::make_shared<testing::GuardedBackend>();
  std::unique_ptr<TrainingSession> cpu = Session(config, nullptr);
  std::unique_ptr<TrainingSession> device = Session(config, guarded);
  ASSERT_TRUE(device->runner().device_resident());
  ASSERT_FALSE(cpu->runner().device_resident());

  const size_t arena_bytes = device->model().num_params() * sizeof(float);
  const size_t micro_batches = static_cast<size_t>(config.micro_batches_per_step());
  const size_t tokens = static_cast<size_t>(config.micro_batch_size) * config.model.context_length;
  for (int64_t step = 0; step < config.steps; ++step) {
    const size_t to_host = guarded->bytes_to_host();
    const size_t from_host = guarded->bytes_from_host();
    const size_t waits = guarded->synchronizations();
    ExpectSameStep(cpu->RunStep(Step(step)), device->RunStep(Step(step)), step);
    // the first step uploads the initial weights and the loss gradients
    if (step == 0) continue;
    // Per step: each micro-batch's inputs and targets up; its loss sum
    // (one double) and the norm and clip factor down; one wait, at the end.
    EXPECT_EQ(guarded->bytes_from_host() - from_host, micro_batches * 2 * tokens * sizeof(int32_t))
        << "step " << step;
    EXPECT_EQ(guarded->bytes_to_host() - to_host, (micro_batches + 2) * sizeof(double))
        << "step " << step;
    EXPECT_EQ(guarded->synchronizations() - waits, 1u) << "step " << step;
  }
  // The weights' working copy (backend.h, AttachParams) was attached and
  // never read stale: only the optimizer changed the weights, and it keeps
  // the copy itself.
  EXPECT_TRUE(guarded->params_attached());
  EXPECT_EQ(guarded->stale_weight_reads(), 0u);
  const model::GptModel& a = std::as_const(*cpu).model();
  const model::GptModel& b = std::as_const(*device).model();
  EXPECT_TRUE(SameBits(a.params(), b.params(), arena_bytes)) << "final weights";
  EXPECT_TRUE(SameBits(std::as_const(*cpu).runner().adam_m(),
                       std::as_const(*device).runner().adam_m(), arena_bytes))
      << "first moments";
  EXPECT_TRUE(SameBits(std::as_const(*cpu).runner().adam_v(),
                       std::as_const(*device).runner().adam_v(), arena_bytes))
      << "second moments";
}

TEST(DeviceResidentStepTest, AStateReadOutAndRestoredContinuesTheSameTrajectory) {
  // A checkpoint's reads (const, mid-run) and a restore's writes (into a
  // fresh session) go through the host copies: the restored session and
  // the one that went on agree with the CPU run bit for bit.
  const TrainingConfig config = Config(6);
  std::unique_ptr<TrainingSession> cpu = Session(config, nullptr);
  std::unique_ptr<TrainingSession> device =
      Session(config, std::make_shared<testing::GuardedBackend>());
  for (int64_t step = 0; step < 3; ++step) {
    ExpectSameStep(cpu->RunStep(Step(step)), device->RunStep(Step(step)), step);
  }
  const size_t n = device->model().num_params();
  const TrainingSession& saved = *device;
  std::vector<float> params(saved.model().params(), saved.model().params() + n);
  std::vector<float> m(saved.runner().adam_m(), saved.runner().adam_m() + n);
  std::vector<float> v(saved.runner().adam_v(), saved.runner().adam_v() + n);

  auto restored_backend = std::make_shared<testing::GuardedBackend>();
  std::unique_ptr<TrainingSession> restored =
      Session(config, restored_backend, /*initialize=*/false);
  ASSERT_TRUE(restored->runner().device_resident());
  std::memcpy(restored->model().params(), params.data(), n * sizeof(float));
  std::memcpy(restored->runner().adam_m(), m.data(), n * sizeof(float));
  std::memcpy(restored->runner().adam_v(), v.data(), n * sizeof(float));
  restored->runner().versions().SetCurrent(3);

  for (int64_t step = 3; step < config.steps; ++step) {
    const absl::StatusOr<StepResult> reference = cpu->RunStep(Step(step));
    ExpectSameStep(reference, device->RunStep(Step(step)), step);
    ExpectSameStep(reference, restored->RunStep(Step(step)), step);
  }
  // The restored weights reached the working copy before a GEMM read them:
  // their upload refreshed it (after the copy made at attach).
  EXPECT_EQ(restored_backend->stale_weight_reads(), 0u);
  EXPECT_GE(restored_backend->param_copy_refreshes(), 2u);
  const model::GptModel& a = std::as_const(*cpu).model();
  EXPECT_TRUE(SameBits(a.params(), std::as_const(*device).model().params(), n * sizeof(float)));
  EXPECT_TRUE(
      SameBits(a.params(), std::as_const(*restored).model().params(), n * sizeof(float)));
}

TEST(DeviceResidentStepTest, AWeightChangedBehindTheCopysBackIsSeenStale) {
  // The check above can fail: weights written on the backend by anything
  // but the optimizer, with no RefreshParamCopy, are read stale by the next
  // step's GEMMs (on a bf16 GPU, old bf16 weights), and a refresh ends it.
  const TrainingConfig config = Config(3);
  auto guarded = std::make_shared<testing::GuardedBackend>();
  std::unique_ptr<TrainingSession> device = Session(config, guarded);
  ASSERT_TRUE(device->RunStep(Step(0)).ok());
  ASSERT_EQ(guarded->stale_weight_reads(), 0u);
  const compute::TensorSpan params = device->model().params_span();
  guarded->CopyWithin(params.Slice(0, 1), params.Slice(1, 1));
  ASSERT_TRUE(device->RunStep(Step(1)).ok());
  const size_t stale = guarded->stale_weight_reads();
  EXPECT_GT(stale, 0u);
  guarded->RefreshParamCopy();
  ASSERT_TRUE(device->RunStep(Step(2)).ok());
  EXPECT_EQ(guarded->stale_weight_reads(), stale);
}

TEST(DeviceResidentStepTest, ANonFiniteNormLeavesTheWeightsAndTheVersion) {
  TrainingConfig config = Config(2);
  config.lr.max_lr = 1e30;  // the first update blows the weights up
  config.lr.min_lr = 1e30;
  config.grad_clip = 0.0;
  std::unique_ptr<TrainingSession> device =
      Session(config, std::make_shared<testing::GuardedBackend>());
  ASSERT_TRUE(device->RunStep(Step(0)).ok());
  const size_t n = device->model().num_params();
  const std::vector<float> before(std::as_const(*device).model().params(),
                                  std::as_const(*device).model().params() + n);
  absl::StatusOr<StepResult> second = device->RunStep(Step(1));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_TRUE(SameBits(before.data(), std::as_const(*device).model().params(), n * sizeof(float)));
  EXPECT_EQ(device->runner().versions().current(), 1);
}

}  // namespace
}  // namespace cohort::train
