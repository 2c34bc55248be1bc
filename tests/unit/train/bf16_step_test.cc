// Training sessions whose activations are bf16 (backend.h, "Activation
// storage"), on GuardedBackend over a bf16-mode CPU backend: the host may
// not touch backend memory, and the activations are bf16 as a bf16 GPU's
// are. The device-resident step (step_runner_device.cc) gives bitwise the
// losses and norms of a bf16 session on host memory (the host-staged
// step's arithmetic), with losses within bf16's rounding of the fp32
// session's; pipeline stages that exchange bf16 activations through
// StepRunner (span.bytes() at a time) agree with one process within the
// same bound.
//
// The bound (derived in tests/unit/model/gpt_model_bf16_test.cc): each
// bf16 store rounds with relative error at most u = 2^-9, an element is
// stored S = 3 + 10 L times on its way to the loss, so a loss is within
// S u of the fp32 one. A few steps of AdamW at lr 1e-3 move the weights by
// about lr per element whatever the gradients' rounding, which changes the
// loss far less than that.

#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/guarded_backend.h"
#include "tests/testing/training_configs.h"
#include "worker/comm/in_memory_communicator.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

constexpr double kU = 1.0 / 512;  // 2^-9

compute::CpuBackendOptions Bf16() {
  return compute::CpuBackendOptions{.num_threads = 1,
                                    .activation_dtype = compute::DType::kBFloat16};
}

double LossBound(const TrainingConfig& config) { return (3.0 + 10.0 * config.model.layers) * kU; }

std::unique_ptr<TrainingSession> Session(const TrainingConfig& config,
                                         std::shared_ptr<compute::Backend> backend) {
  TrainingSessionOptions options;
  options.num_threads = 1;
  options.backend = std::move(backend);
  options.initialize_parameters = true;
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      TrainingSession::Create(config, model::ModelLayout{}, {}, options);
  CHECK(session.ok()) << session.status();
  return *std::move(session);
}

TEST(Bf16StepTest, TheDeviceResidentStepIsTheHostBf16StepAndNearFp32) {
  TrainingConfig config = testing::SmallTrainingConfig(6, 2, 4);
  config.grad_clip = 1.0;
  auto guarded = std::make_shared<testing::GuardedBackend>(Bf16());
  std::unique_ptr<TrainingSession> device = Session(config, guarded);
  std::unique_ptr<TrainingSession> host =
      Session(config, std::make_shared<compute::CpuBackend>(Bf16()));
  std::unique_ptr<TrainingSession> fp32 = Session(config, nullptr);
  ASSERT_TRUE(device->runner().device_resident());
  ASSERT_FALSE(host->runner().device_resident());
  ASSERT_EQ(device->model().backend()->activation_dtype(), compute::DType::kBFloat16);
  bool rounded = false;
  for (int64_t step = 0; step < config.steps; ++step) {
    const absl::StatusOr<StepResult> a = device->RunStep(Step(step));
    const absl::StatusOr<StepResult> b = host->RunStep(Step(step));
    const absl::StatusOr<StepResult> c = fp32->RunStep(Step(step));
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status() << b.status() << c.status();
    EXPECT_EQ(std::memcmp(&a->loss, &b->loss, sizeof(double)), 0) << "loss, step " << step;
    EXPECT_EQ(std::memcmp(&a->grad_norm, &b->grad_norm, sizeof(double)), 0)
        << "norm, step " << step;
    EXPECT_LE(std::abs(a->loss - c->loss), LossBound(config) * c->loss)
        << "step " << step << ": bf16 " << a->loss << ", fp32 " << c->loss;
    rounded = rounded || a->loss != c->loss;
  }
  EXPECT_TRUE(rounded) << "the bf16 session computed the fp32 losses";
  const size_t n = device->model().num_params();
  EXPECT_EQ(std::memcmp(std::as_const(*device).model().params(),
                        std::as_const(*host).model().params(), n * sizeof(float)),
            0)
      << "final weights";
}

TEST(Bf16StepTest, PipelineStagesExchangeBf16ActivationsAndAgreeWithOneProcess) {
  // 4 micro-batches per step over 2 stages, 2 held-out batches; every stage
  // on its own guarded bf16 backend (host staged: a pipeline's step is).
  constexpr int kSteps = 2, pp = 2;
  TrainingConfig config = testing::SmallTrainingConfig(8, 2, kSteps);
  config.data.held_out_fraction = 0.2;
  config.validation_batches = 2;
  TrainingSessionOptions single_options;
  single_options.num_threads = 1;
  single_options.tie_per_micro_batch = false;  // the pipeline's tie, once per step
  single_options.backend = std::make_shared<testing::GuardedBackend>(Bf16());
  absl::StatusOr<std::unique_ptr<TrainingSession>> single =
      TrainingSession::Create(config, model::ModelLayout{}, {}, single_options);
  ASSERT_TRUE(single.ok()) << single.status();
  std::vector<double> want;
  for (int s = 0; s < kSteps; ++s) {
    absl::StatusOr<StepResult> step = (*single)->runner().Run(Step(s));
    ASSERT_TRUE(step.ok()) << step.status();
    want.push_back(step->loss);
  }
  absl::StatusOr<double> want_validation = (*single)->Validate();
  ASSERT_TRUE(want_validation.ok()) << want_validation.status();

  comm::InMemoryFabric fabric(pp);
  std::vector<absl::Status> statuses(pp);
  std::vector<std::vector<double>> losses(pp);
  std::vector<double> validations(pp, -1.0);
  std::vector<std::thread> threads;
  for (int p = 0; p < pp; ++p) {
    threads.emplace_back([&, p] {
      comm::InMemoryCommunicator pipeline(&fabric, p);
      TrainingGroups groups;
      groups.pipeline = &pipeline;
      TrainingSessionOptions options;
      options.num_threads = 1;
      options.collective_timeout = absl::Seconds(60);
      options.backend = std::make_shared<testing::GuardedBackend>(Bf16());
      const model::ModelLayout layout{.tp = 1, .tp_rank = 0, .pp = pp, .stage = p};
      absl::StatusOr<std::unique_ptr<TrainingSession>> session =
          TrainingSession::Create(config, layout, groups, options);
      if (!session.ok()) {
        statuses[p] = session.status();
        return;
      }
      for (int s = 0; s < kSteps; ++s) {
        absl::StatusOr<StepResult> step = (*session)->runner().Run(Step(s));
        if (!step.ok()) {
          statuses[p] = step.status();
          return;
        }
        losses[p].push_back(step->loss);
      }
      absl::StatusOr<double> validation = (*session)->Validate();
      statuses[p] = validation.status();
      if (validation.ok()) validations[p] = *validation;
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double bound = LossBound(config);
  for (int p = 0; p < pp; ++p) {
    ASSERT_TRUE(statuses[p].ok()) << "stage " << p << ": " << statuses[p];
    ASSERT_EQ(losses[p].size(), want.size());
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_LE(std::abs(losses[p][s] - want[s]), bound * want[s])
          << "stage " << p << ", step " << s << ": " << losses[p][s] << " vs " << want[s];
    }
    EXPECT_LE(std::abs(validations[p] - *want_validation), bound * *want_validation)
        << "stage " << p;
  }
  // Every stage reports the same (last stage's) losses.
  EXPECT_EQ(losses[0], losses[1]);
}

}  // namespace
}  // namespace cohort::train
