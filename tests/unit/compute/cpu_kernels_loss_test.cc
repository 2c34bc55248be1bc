// Fused softmax + cross-entropy on CpuBackend against a double reference.

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::compute {
namespace {

using ref::RandomFloats;
using ref::RelativeError;
using ref::Span;
using ref::ToDouble;
using ref::Vec;

constexpr int kN = 13, kV = 50, kVp = 64;

TEST(CpuCrossEntropyTest, ForwardIgnoresPaddingColumns) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> logits = RandomFloats(kN * kVp, 1, 4.0f);
  // Huge padding logits would dominate the softmax if they were included.
  for (int n = 0; n < kN; ++n)
    for (int i = kV; i < kVp; ++i) logits[n * kVp + i] = 1000.0f;
  logits[0] = 80.0f;  // a large real logit: needs the max subtraction
  std::vector<int32_t> targets(kN);
  for (int n = 0; n < kN; ++n) targets[n] = (n * 11) % kV;
  targets[1] = kV - 1;
  std::vector<float> losses(kN), lse(kN);
  backend.CrossEntropyForward(Span(losses), Span(lse), Span(logits), Span(targets), kN, kV, kVp);
  const Vec want = ref::CrossEntropy(ToDouble(logits), targets, kN, kV, kVp);
  EXPECT_LT(RelativeError(losses, want), 1e-6);
  for (int n = 0; n < kN; ++n) {
    EXPECT_NEAR(lse[n] - logits[n * kVp + targets[n]], want[n], 1e-4 * (1 + want[n]));
  }
}

TEST(CpuCrossEntropyTest, BackwardIsScaledSoftmaxMinusOneHotAndZeroInPadding) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> logits = RandomFloats(kN * kVp, 2, 4.0f);
  std::vector<int32_t> targets(kN);
  for (int n = 0; n < kN; ++n) targets[n] = (n * 7 + 3) % kV;
  std::vector<float> losses(kN), lse(kN), dlosses(kN);
  for (int n = 0; n < kN; ++n) dlosses[n] = 0.5f + 0.1f * n;
  backend.CrossEntropyForward(Span(losses), Span(lse), Span(logits), Span(targets), kN, kV, kVp);
  std::vector<float> dlogits(kN * kVp, 123.0f);  // written, not accumulated
  backend.CrossEntropyBackward(Span(dlogits), Span(logits), Span(lse), Span(targets), Span(dlosses),
                               kN, kV, kVp);
  const Vec want = ref::CrossEntropyGrad(ToDouble(logits), targets, dlosses, kN, kV, kVp);
  EXPECT_LT(RelativeError(dlogits, want), 2e-6);
  for (int n = 0; n < kN; ++n)
    for (int i = kV; i < kVp; ++i) EXPECT_EQ(dlogits[n * kVp + i], 0.0f);
  // Finite-difference sanity check of the analytic gradient (row 0, a few
  // columns), through the kernel's own forward in double-rounded float.
  const Vec base = ref::CrossEntropy(ToDouble(logits), targets, kN, kV, kVp);
  for (int i : {0, targets[0], kV - 1}) {
    Vec plus = ToDouble(logits);
    plus[i] += 1e-6;
    const double fd = (ref::CrossEntropy(plus, targets, kN, kV, kVp)[0] - base[0]) / 1e-6;
    EXPECT_NEAR(fd * dlosses[0], want[i], 1e-5) << i;
  }
}

}  // namespace
}  // namespace cohort::compute
