// DeviceOptimizer on the guarded backend (memory the host may not touch, the
// CPU's arithmetic) against the host optimizer the StepRunner runs: the same
// norm, clip factor, weights and moments, bit for bit, update after update.

#include "worker/train/device_optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/guarded_backend.h"
#include "tests/testing/random_values.h"
#include "worker/model/parameter_table.h"
#include "worker/train/adamw.h"
#include "worker/train/grad_norm.h"
#include "worker/train/grad_norm_plan.h"

namespace cohort::train {
namespace {

using compute::Buffer;
using compute::DType;
using model::GptConfig;
using model::ParameterTable;

// wte and the matrices span several 16384-element pieces.
const GptConfig kConfig{
    .layers = 2, .heads = 4, .width = 128, .vocab_size = 500, .context_length = 64};

struct HostState {
  std::vector<float> params, m, v;
};

// The host path of StepRunner::Run: Fill + Norm, ClipScale + ScaleInPlace,
// AdamWUpdate.
double HostStep(const GradNormPlan& plan, const ParameterTable& table, std::vector<float> grads,
                const DeviceOptimizerOptions& options, double lr, int64_t t, HostState* state) {
  std::vector<double> slots;
  plan.Fill(grads.data(), 0, grads.size(), &slots, 2);
  const double norm = GradNormPlan::Norm(slots);
  if (!std::isfinite(norm)) return norm;
  const double clip = ClipScale(norm, options.grad_clip);
  if (clip != 1.0) ScaleInPlace(grads.data(), grads.size(), static_cast<float>(clip), 2);
  AdamWSlice slice{.params = state->params.data(),
                   .grads = grads.data(),
                   .m = state->m.data(),
                   .v = state->v.data(),
                   .begin = 0,
                   .count = grads.size()};
  AdamWOptions adamw = options.adamw;
  adamw.num_threads = 2;
  EXPECT_TRUE(AdamWUpdate(adamw, slice, WeightDecayRanges(table, 0, grads.size()), lr, t).ok());
  return norm;
}

class DeviceOptimizerTest : public ::testing::TestWithParam<double> {};

TEST_P(DeviceOptimizerTest, MatchesTheHostOptimizerBitForBit) {
  const ParameterTable table(kConfig);
  const GradNormPlan plan(kConfig, table);
  const size_t n = table.num_params();
  DeviceOptimizerOptions options;
  options.adamw.weight_decay = 0.1;
  options.grad_clip = GetParam();

  testing::GuardedBackend backend(2);
  auto optimizer = DeviceOptimizer::Create(&backend, plan, table, 0, n, options);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  (*optimizer)->ResetMoments();

  HostState host;
  host.params = testing::RandomMixedMagnitudes(1, n, 11, 4)[0];
  host.m.assign(n, 0.0f);
  host.v.assign(n, 0.0f);
  absl::StatusOr<Buffer> params = backend.Allocate(DType::kFloat32, n);
  absl::StatusOr<Buffer> grads = backend.Allocate(DType::kFloat32, n);
  ASSERT_TRUE(params.ok() && grads.ok());
  backend.CopyFromHost(params->span(), host.params.data());

  const std::vector<std::vector<float>> gradients = testing::RandomMixedMagnitudes(3, n, 12, 6);
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float>& g = gradients[t - 1];
    backend.CopyFromHost(grads->span(), g.data());
    const double lr = 1e-3 * t;
    const double host_norm = HostStep(plan, table, g, options, lr, t, &host);
    ASSERT_TRUE((*optimizer)->Enqueue(params->span(), grads->span(), lr, t).ok());
    absl::StatusOr<double> norm = (*optimizer)->Norm();
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_EQ(*norm, host_norm) << "update " << t;

    std::vector<float> device_params(n), device_m(n), device_v(n);
    backend.CopyToHost(device_params.data(), params->span());
    backend.CopyToHost(device_m.data(), (*optimizer)->m());
    backend.CopyToHost(device_v.data(), (*optimizer)->v());
    EXPECT_EQ(std::memcmp(device_params.data(), host.params.data(), n * sizeof(float)), 0)
        << "weights differ after update " << t;
    EXPECT_EQ(std::memcmp(device_m.data(), host.m.data(), n * sizeof(float)), 0)
        << "first moments differ after update " << t;
    EXPECT_EQ(std::memcmp(device_v.data(), host.v.data(), n * sizeof(float)), 0)
        << "second moments differ after update " << t;
  }
}

// 0: no clipping; 1e-3: every update clipped (the random gradients' norms
// are far larger); 1e6: a limit never reached.
INSTANTIATE_TEST_SUITE_P(Clip, DeviceOptimizerTest, ::testing::Values(0.0, 1e-3, 1e6));

TEST(DeviceOptimizerStandaloneTest, ANonFiniteGradientLeavesTheStateAsItWas) {
  const ParameterTable table(kConfig);
  const GradNormPlan plan(kConfig, table);
  const size_t n = table.num_params();
  testing::GuardedBackend backend(2);
  auto optimizer = DeviceOptimizer::Create(&backend, plan, table, 0, n, {});
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  (*optimizer)->ResetMoments();
  std::vector<float> weights(n, 0.5f), g(n, 1e-3f);
  g[n / 2] = std::numeric_limits<float>::infinity();
  absl::StatusOr<Buffer> params = backend.Allocate(DType::kFloat32, n);
  absl::StatusOr<Buffer> grads = backend.Allocate(DType::kFloat32, n);
  ASSERT_TRUE(params.ok() && grads.ok());
  backend.CopyFromHost(params->span(), weights.data());
  backend.CopyFromHost(grads->span(), g.data());
  ASSERT_TRUE((*optimizer)->Enqueue(params->span(), grads->span(), 1e-3, 1).ok());
  absl::StatusOr<double> norm = (*optimizer)->Norm();
  ASSERT_TRUE(norm.ok());
  EXPECT_TRUE(std::isinf(*norm));
  std::vector<float> after(n), m(n, 1.0f);
  backend.CopyToHost(after.data(), params->span());
  backend.CopyToHost(m.data(), (*optimizer)->m());
  EXPECT_EQ(after, weights);
  EXPECT_EQ(m, std::vector<float>(n, 0.0f));
}

TEST(DeviceOptimizerStandaloneTest, ANonFiniteLossSumSkipsAFiniteUpdate) {
  // Finite gradients, but one of the step's loss sums is NaN: nothing is
  // updated, and the norm reads NaN (SkipUpdateUnlessFinite).
  const ParameterTable table(kConfig);
  const GradNormPlan plan(kConfig, table);
  const size_t n = table.num_params();
  testing::GuardedBackend backend(1);
  auto optimizer = DeviceOptimizer::Create(&backend, plan, table, 0, n, {});
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  (*optimizer)->ResetMoments();
  const std::vector<float> weights(n, 0.5f), g(n, 1e-3f);
  const std::vector<double> sums = {3.0, std::numeric_limits<double>::quiet_NaN(), 1.0};
  absl::StatusOr<Buffer> params = backend.Allocate(DType::kFloat32, n);
  absl::StatusOr<Buffer> grads = backend.Allocate(DType::kFloat32, n);
  absl::StatusOr<Buffer> losses = backend.Allocate(DType::kFloat64, sums.size());
  ASSERT_TRUE(params.ok() && grads.ok() && losses.ok());
  backend.CopyFromHost(params->span(), weights.data());
  backend.CopyFromHost(grads->span(), g.data());
  backend.CopyFromHost(losses->span(), sums.data());
  ASSERT_TRUE((*optimizer)->Enqueue(params->span(), grads->span(), 1e-3, 1, losses->span()).ok());
  absl::StatusOr<double> norm = (*optimizer)->Norm();
  ASSERT_TRUE(norm.ok());
  EXPECT_TRUE(std::isnan(*norm));
  std::vector<float> after(n);
  backend.CopyToHost(after.data(), params->span());
  EXPECT_EQ(after, weights);
  // Finite sums leave the update alone.
  const std::vector<double> finite = {3.0, 2.0, 1.0};
  backend.CopyFromHost(losses->span(), finite.data());
  ASSERT_TRUE((*optimizer)->Enqueue(params->span(), grads->span(), 1e-3, 1, losses->span()).ok());
  norm = (*optimizer)->Norm();
  ASSERT_TRUE(norm.ok());
  EXPECT_TRUE(std::isfinite(*norm));
  backend.CopyToHost(after.data(), params->span());
  EXPECT_NE(after, weights);
}

TEST(DeviceOptimizerStandaloneTest, SumLossesIsTheHostsSerialDoubleSumOnTheCpu) {
  // What GptModel::HeadLoss did on the host with the losses it copied
  // back; the CPU backend's op must give its bits (the device-resident
  // step's losses stay what they were).
  testing::GuardedBackend backend(2);
  std::vector<float> values(4099);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(std::sin(0.37 * i) * 9.0 + 1e-3 * i);
  }
  double serial = 0.0;
  for (float value : values) serial += value;
  absl::StatusOr<Buffer> losses = backend.Allocate(DType::kFloat32, values.size());
  absl::StatusOr<Buffer> sum = backend.Allocate(DType::kFloat64, 1);
  ASSERT_TRUE(losses.ok() && sum.ok());
  backend.CopyFromHost(losses->span(), values.data());
  backend.SumLosses(sum->span(), losses->span());
  double device = 0.0;
  backend.CopyToHost(&device, sum->span());
  EXPECT_EQ(std::memcmp(&device, &serial, sizeof(double)), 0) << device << " vs " << serial;
}

TEST(DeviceOptimizerStandaloneTest, RefusesARangeOutsideTheArenaAndBadUpdates) {
  const ParameterTable table(kConfig);
  const GradNormPlan plan(kConfig, table);
  testing::GuardedBackend backend(1);
  auto outside = DeviceOptimizer::Create(&backend, plan, table, 0, table.num_params() + 1, {});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  auto optimizer = DeviceOptimizer::Create(&backend, plan, table, 0, table.num_params(), {});
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  compute::TensorSpan none;
  EXPECT_EQ((*optimizer)->Enqueue(none, none, 1e-3, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*optimizer)->Enqueue(none, none, -1.0, 1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::train
