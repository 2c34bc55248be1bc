// A training session on a backend of device memory reserves, when it is
// built, the memory it will hold (TrainingSession::EstimateDeviceBytes,
// Backend::ReserveDeviceMemory; issue 45's "one arena sized for the
// training session up front"), so a job too large for its GPU fails at
// Prepare, naming the bytes, and never in a step. Run on GuardedBackend,
// which keeps the books of every Allocate: the reservation must cover what
// the session then holds, with no more slack than the allocator's
// rounding, and nothing may be allocated once the first step has run. Each
// test runs with fp32 activations and with bf16 ones (a bf16 GPU's: the
// activations take half the bytes, the statistics stay fp32), whose bytes
// the estimate counts per dtype.

#include <memory>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tests/testing/guarded_backend.h"
#include "tests/testing/training_configs.h"
#include "worker/compute/cpu_backend.h"
#include "worker/compute/gpu_launch_plan.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

// The activation dtype each test runs with.
class SessionDeviceMemoryTest : public ::testing::TestWithParam<compute::DType> {
 protected:
  std::shared_ptr<testing::GuardedBackend> Guarded() const {
    return std::make_shared<testing::GuardedBackend>(
        compute::CpuBackendOptions{.num_threads = 1, .activation_dtype = GetParam()});
  }
};

TrainingConfig Config() {
  TrainingConfig config = testing::SmallTrainingConfig(/*global_batch=*/6, /*micro_batch=*/2,
                                                       /*steps=*/4);
  config.grad_clip = 1.0;
  return config;
}

absl::StatusOr<std::unique_ptr<TrainingSession>> Session(
    const TrainingConfig& config, std::shared_ptr<testing::GuardedBackend> backend,
    bool keep_previous = false) {
  TrainingSessionOptions options;
  options.num_threads = 1;
  options.backend = std::move(backend);
  options.initialize_parameters = true;
  options.state_versions.keep_previous = keep_previous;
  return TrainingSession::Create(config, model::ModelLayout{}, {}, options);
}

// The reservation holds every allocation, and exceeds them by no more than
// the device allocator's rounding of each.
void ExpectTheReservationFits(const testing::GuardedBackend& backend) {
  const size_t reserved = backend.reserved_bytes();
  ASSERT_GT(reserved, 0u);
  EXPECT_GE(reserved, backend.peak_bytes()) << "allocated past the reservation";
  EXPECT_LE(reserved - backend.peak_bytes(),
            backend.allocations() * compute::gpu_plan::kDeviceAlignment)
      << "reserved " << reserved << " bytes for " << backend.peak_bytes() << " in "
      << backend.allocations() << " allocations";
}

TEST_P(SessionDeviceMemoryTest,
       ADeviceResidentSessionHoldsWhatItReservedAndAllocatesNoMoreInSteps) {
  const TrainingConfig config = Config();
  std::shared_ptr<testing::GuardedBackend> guarded = Guarded();
  absl::StatusOr<std::unique_ptr<TrainingSession>> session = Session(config, guarded);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->runner().device_resident());
  ASSERT_TRUE((*session)->RunStep(Step(0)).ok());
  const size_t allocations = guarded->allocations();
  for (int64_t step = 1; step < config.steps; ++step) {
    ASSERT_TRUE((*session)->RunStep(Step(step)).ok());
  }
  EXPECT_EQ(guarded->allocations(), allocations) << "a step allocated backend memory";
  ExpectTheReservationFits(*guarded);
}

TEST_P(SessionDeviceMemoryTest, AHostStagedSessionReservesOnlyWhatItKeepsOnTheDevice) {
  // A kept previous version stages through the host: the gradient tree and
  // the moments are host memory, and are not reserved on the device.
  const TrainingConfig config = Config();
  std::shared_ptr<testing::GuardedBackend> guarded = Guarded();
  absl::StatusOr<std::unique_ptr<TrainingSession>> session =
      Session(config, guarded, /*keep_previous=*/true);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_FALSE((*session)->runner().device_resident());
  for (int64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE((*session)->RunStep(Step(step)).ok());
  }
  ExpectTheReservationFits(*guarded);
}

TEST_P(SessionDeviceMemoryTest, ADeviceTooSmallFailsAtCreationNamingTheBytes) {
  const TrainingConfig config = Config();
  std::shared_ptr<testing::GuardedBackend> probe = Guarded();
  absl::StatusOr<uint64_t> needed = TrainingSession::EstimateDeviceBytes(
      config, model::ModelLayout{}, 1, *probe, TrainingSessionOptions{});
  ASSERT_TRUE(needed.ok()) << needed.status();
  std::shared_ptr<testing::GuardedBackend> guarded = Guarded();
  guarded->set_capacity(*needed - 1);
  absl::StatusOr<std::unique_ptr<TrainingSession>> session = Session(config, guarded);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kResourceExhausted) << session.status();
  const std::string message(session.status().message());
  EXPECT_NE(message.find(std::to_string(*needed) + " bytes of device memory"), std::string::npos)
      << message;
  EXPECT_NE(message.find(std::to_string(*needed - 1) + " bytes free"), std::string::npos)
      << message;
  EXPECT_EQ(guarded->allocations(), 0u) << "the model allocated before the reservation failed";
  // Exactly enough is enough.
  std::shared_ptr<testing::GuardedBackend> exact = Guarded();
  exact->set_capacity(*needed);
  EXPECT_TRUE(Session(config, exact).ok());
}

INSTANTIATE_TEST_SUITE_P(ActivationDtypes, SessionDeviceMemoryTest,
                         ::testing::Values(compute::DType::kFloat32, compute::DType::kBFloat16),
                         [](const ::testing::TestParamInfo<compute::DType>& info) {
                           return std::string(compute::DTypeName(info.param));
                         });

TEST(SessionDeviceMemoryDtypeTest, Bf16ActivationsReserveLessThanFp32Ones) {
  // The estimate follows the dtype: bf16 activations take fewer bytes than
  // fp32 ones (the weights, gradients and moments, fp32 in both, the rest).
  testing::GuardedBackend fp32(1);
  testing::GuardedBackend bf16(
      compute::CpuBackendOptions{.num_threads = 1, .activation_dtype = compute::DType::kBFloat16});
  absl::StatusOr<uint64_t> fp32_bytes = TrainingSession::EstimateDeviceBytes(
      Config(), model::ModelLayout{}, 1, fp32, TrainingSessionOptions{});
  absl::StatusOr<uint64_t> bf16_bytes = TrainingSession::EstimateDeviceBytes(
      Config(), model::ModelLayout{}, 1, bf16, TrainingSessionOptions{});
  ASSERT_TRUE(fp32_bytes.ok() && bf16_bytes.ok());
  EXPECT_LT(*bf16_bytes, *fp32_bytes);
}

TEST(SessionDeviceMemoryHostTest, ABackendOfHostMemoryReservesNothing) {
  compute::CpuBackend cpu(compute::CpuBackendOptions{.num_threads = 1});
  absl::StatusOr<uint64_t> needed = TrainingSession::EstimateDeviceBytes(
      Config(), model::ModelLayout{}, 1, cpu, TrainingSessionOptions{});
  ASSERT_TRUE(needed.ok()) << needed.status();
  EXPECT_EQ(*needed, 0u);
}

}  // namespace
}  // namespace cohort::train
