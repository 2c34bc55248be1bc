// A checkpoint of state that stays in backend memory (issue 45: "the
// snapshot a checkpoint needs is taken with a device-to-device copy, then
// drained"): DeviceSnapshot copies the weights and moments on the backend
// and drains them with Backend::CopyToHostSide, which GuardedBackend runs
// with a GPU side stream's timing (the bytes land on the host only at Wait,
// from any thread, and writing the copy's source before then dies). So the
// checks below fail if the snapshot drained the live state, waited inside a
// step, or handed out the state of a later step.

#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/guarded_backend.h"
#include "tests/testing/training_configs.h"
#include "worker/model/model_layout.h"
#include "worker/train/device_snapshot.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

using compute::DType;
using compute::TensorSpan;

bool SameBits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

compute::Buffer Filled(testing::GuardedBackend& backend, size_t n, float first) {
  absl::StatusOr<compute::Buffer> buffer = backend.Allocate(DType::kFloat32, n);
  CHECK(buffer.ok()) << buffer.status();
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = first + static_cast<float>(i);
  backend.CopyFromHost(buffer->span(), host.data());
  return *std::move(buffer);
}

TEST(DeviceSnapshotTest, DrainsTheStateAsItWasWhenTakenWhileTheLiveStateMovesOn) {
  testing::GuardedBackend backend;
  constexpr size_t kCount = 1000;
  compute::Buffer params = Filled(backend, kCount, 1.0f);
  compute::Buffer m = Filled(backend, kCount, 5000.0f);
  compute::Buffer v = Filled(backend, kCount, 9000.0f);
  absl::StatusOr<std::unique_ptr<DeviceSnapshot>> snapshot =
      DeviceSnapshot::Create(&backend, kCount);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  const size_t waits = backend.synchronizations();
  ASSERT_TRUE((*snapshot)->Take(params.span(), m.span(), v.span()).ok());
  // The next step writes the live state at once; the drain reads the copy
  // (GuardedBackend dies on a write into a side copy's source).
  backend.Zero(params.span());
  backend.Zero(m.span());
  absl::Status drained;
  std::thread uploader([&] { drained = (*snapshot)->Wait(); });  // the writer's thread
  uploader.join();
  ASSERT_TRUE(drained.ok()) << drained;
  EXPECT_EQ(backend.synchronizations(), waits) << "taking a snapshot must not wait for the device";
  EXPECT_EQ(backend.side_copy_calls(), 1u);
  const float* host = (*snapshot)->host();
  for (size_t i = 0; i < kCount; i += 97) {
    EXPECT_EQ(host[i], 1.0f + i) << i;
    EXPECT_EQ(host[kCount + i], 5000.0f + i) << i;
    EXPECT_EQ(host[2 * kCount + i], 9000.0f + i) << i;
  }
  // A second Take reuses the buffers (the first drain is done) and sees
  // the state of its own moment.
  ASSERT_TRUE((*snapshot)->Take(params.span(), m.span(), v.span()).ok());
  ASSERT_TRUE((*snapshot)->Wait().ok());
  EXPECT_EQ((*snapshot)->host()[5], 0.0f);
  EXPECT_EQ((*snapshot)->host()[2 * kCount + 5], 9005.0f);
  EXPECT_TRUE((*snapshot)->Wait().ok()) << "Wait without a new Take repeats the last result";
}

TEST(DeviceSnapshotTest, ASecondTakeWaitsForTheFirstDrainBeforeItOverwritesTheBuffer) {
  testing::GuardedBackend backend;
  compute::Buffer state = Filled(backend, 64, 2.0f);
  absl::StatusOr<std::unique_ptr<DeviceSnapshot>> snapshot = DeviceSnapshot::Create(&backend, 64);
  ASSERT_TRUE(snapshot.ok());
  ASSERT_TRUE((*snapshot)->Take(state.span(), state.span(), state.span()).ok());
  // No Wait in between: without one, the copies into the snapshot's
  // buffer would write the first drain's source (a CHECK in the backend).
  ASSERT_TRUE((*snapshot)->Take(state.span(), state.span(), state.span()).ok());
  ASSERT_TRUE((*snapshot)->Wait().ok());
  EXPECT_EQ((*snapshot)->host()[3], 5.0f);
}

TEST(DeviceSnapshotTest, RefusesSpansOfAnotherSizeOrType) {
  testing::GuardedBackend backend;
  compute::Buffer state = Filled(backend, 64, 0.0f);
  absl::StatusOr<compute::Buffer> halves = backend.Allocate(DType::kBFloat16, 64);
  ASSERT_TRUE(halves.ok());
  absl::StatusOr<std::unique_ptr<DeviceSnapshot>> snapshot = DeviceSnapshot::Create(&backend, 64);
  ASSERT_TRUE(snapshot.ok());
  const absl::Status short_m =
      (*snapshot)->Take(state.span(), state.Slice(0, 63), state.span());
  EXPECT_EQ(short_m.code(), absl::StatusCode::kInvalidArgument) << short_m;
  EXPECT_NE(short_m.message().find("first moments"), std::string::npos) << short_m;
  EXPECT_EQ((*snapshot)->Take(state.span(), state.span(), halves->span()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceSnapshot::Create(&backend, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.side_copy_calls(), 0u);
}

TEST(DeviceSnapshotDeathTest, WritingASideCopysSourceBeforeItsWaitDies) {
  // The rule the snapshot exists for: what a side copy reads stays as it
  // is until the copy is done (a GPU's side stream reads it meanwhile).
  EXPECT_DEATH(
      {
        testing::GuardedBackend backend;
        compute::Buffer state = Filled(backend, 16, 0.0f);
        absl::StatusOr<compute::Buffer> host = backend.AllocateHost(DType::kFloat32, 16);
        std::unique_ptr<compute::SideCopy> copy =
            backend.CopyToHostSide(host->data(), state.span());
        backend.Zero(state.Slice(4, 1));
      },
      "written while a side copy still reads it");
}

TrainingConfig Config(int steps) {
  TrainingConfig config = testing::SmallTrainingConfig(6, 2, steps);
  config.grad_clip = 1.0;
  config.adamw.weight_decay = 0.1;
  return config;
}

absl::StatusOr<std::unique_ptr<TrainingSession>> Session(
    const TrainingConfig& config, std::shared_ptr<compute::Backend> backend, bool snapshot) {
  TrainingSessionOptions options;
  options.num_threads = 1;
  options.backend = std::move(backend);
  options.checkpoint_snapshot = snapshot;
  return TrainingSession::Create(config, model::ModelLayout{}, {}, options);
}

TEST(DeviceSnapshotTest, ASessionsSnapshotHoldsTheCpuRunsStateAtItsStepWhileTheNextStepRuns) {
  const TrainingConfig config = Config(4);
  auto guarded = std::make_shared<testing::GuardedBackend>();
  absl::StatusOr<std::unique_ptr<TrainingSession>> cpu = Session(config, nullptr, true);
  absl::StatusOr<std::unique_ptr<TrainingSession>> device = Session(config, guarded, true);
  ASSERT_TRUE(cpu.ok() && device.ok()) << cpu.status() << device.status();
  ASSERT_TRUE((*device)->runner().device_resident());
  ASSERT_NE((*device)->device_snapshot(), nullptr);
  EXPECT_EQ((*cpu)->device_snapshot(), nullptr) << "the host path needs none";
  EXPECT_EQ((*cpu)->TakeSnapshot().code(), absl::StatusCode::kFailedPrecondition);
  for (int64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE((*cpu)->RunStep(Step(step)).ok());
    ASSERT_TRUE((*device)->RunStep(Step(step)).ok());
  }
  const size_t waits = guarded->synchronizations();
  ASSERT_TRUE((*device)->TakeSnapshot().ok());
  // The next step runs before the drain is waited for; it waits once, as
  // every device-resident step does (nothing for the snapshot).
  ASSERT_TRUE((*device)->RunStep(Step(2)).ok());
  EXPECT_EQ(guarded->synchronizations() - waits, 1u);
  DeviceSnapshot& snapshot = *(*device)->device_snapshot();
  ASSERT_TRUE(snapshot.Wait().ok());
  const TrainingSession& reference = **cpu;
  const size_t n = reference.model().num_params();
  ASSERT_EQ(snapshot.count(), n);
  const size_t bytes = n * sizeof(float);
  EXPECT_TRUE(SameBits(snapshot.host(), reference.model().params(), bytes)) << "weights";
  EXPECT_TRUE(SameBits(snapshot.host() + n, reference.runner().adam_m(), bytes)) << "m";
  EXPECT_TRUE(SameBits(snapshot.host() + 2 * n, reference.runner().adam_v(), bytes)) << "v";
}

TEST(DeviceSnapshotTest, TheReservationHoldsTheSnapshotOrTheSessionGoesWithoutIt) {
  const TrainingConfig config = Config(2);
  TrainingSessionOptions options;
  options.num_threads = 1;
  auto probe = std::make_shared<testing::GuardedBackend>();
  absl::StatusOr<uint64_t> without =
      TrainingSession::EstimateDeviceBytes(config, model::ModelLayout{}, 1, *probe, options);
  options.checkpoint_snapshot = true;
  absl::StatusOr<uint64_t> with =
      TrainingSession::EstimateDeviceBytes(config, model::ModelLayout{}, 1, *probe, options);
  ASSERT_TRUE(without.ok() && with.ok());
  const TrainingSession& sized = **Session(config, nullptr, false);
  EXPECT_EQ(*with - *without, DeviceSnapshot::DeviceBytes(sized.model().num_params()));

  // Room for everything: the snapshot is in the reservation, which still
  // holds every allocation.
  auto roomy = std::make_shared<testing::GuardedBackend>();
  absl::StatusOr<std::unique_ptr<TrainingSession>> full = Session(config, roomy, true);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_NE((*full)->device_snapshot(), nullptr);
  EXPECT_EQ(roomy->reserved_bytes(), *with);
  EXPECT_GE(roomy->reserved_bytes(), roomy->peak_bytes());

  // Room for the session but not its snapshot: built without it.
  auto tight = std::make_shared<testing::GuardedBackend>();
  tight->set_capacity(*with - 1);
  absl::StatusOr<std::unique_ptr<TrainingSession>> lean = Session(config, tight, true);
  ASSERT_TRUE(lean.ok()) << lean.status();
  EXPECT_EQ((*lean)->device_snapshot(), nullptr);
  EXPECT_EQ(tight->reserved_bytes(), *without);
  EXPECT_TRUE((*lean)->RunStep(Step(0)).ok());

  // Room for neither: refused, naming the session's bytes.
  auto small = std::make_shared<testing::GuardedBackend>();
  small->set_capacity(*without - 1);
  absl::StatusOr<std::unique_ptr<TrainingSession>> refused = Session(config, small, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
}

}  // namespace
}  // namespace cohort::train
