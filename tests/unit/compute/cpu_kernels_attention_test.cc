// Causal attention on CpuBackend against a double reference; the
// reference's backward against finite differences.

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

struct Shape {
  int B, T, C, NH;
};

class CpuAttentionTest : public ::testing::TestWithParam<Shape> {};

TEST_P(CpuAttentionTest, ForwardMatchesReferenceAndProbabilitiesAreCausal) {
  const auto [B, T, C, NH] = GetParam();
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> qkv = RandomFloats(B * T * 3 * C, 1, 2.0f);
  std::vector<float> out(B * T * C, 7.0f), att(backend.AttentionStateNumel(B, T, C, NH), 7.0f);
  backend.AttentionForward(Span(out), Span(att), Span(qkv), B, T, C, NH);
  EXPECT_LT(RelativeError(out, ref::Attention(ToDouble(qkv), B, T, C, NH)), 2e-6);
  // Each row of att is a distribution over positions <= t.
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      double sum = 0.0;
      for (int u = 0; u < T; ++u) {
        const float p = att[(bh * T + t) * T + u];
        if (u > t) {
          EXPECT_EQ(p, 0.0f);
        } else {
          EXPECT_GT(p, 0.0f);
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
}

TEST_P(CpuAttentionTest, BackwardMatchesReference) {
  const auto [B, T, C, NH] = GetParam();
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> qkv = RandomFloats(B * T * 3 * C, 2, 2.0f);
  std::vector<float> out(B * T * C), att(backend.AttentionStateNumel(B, T, C, NH));
  backend.AttentionForward(Span(out), Span(att), Span(qkv), B, T, C, NH);
  std::vector<float> dout = RandomFloats(out.size(), 3);
  std::vector<float> dqkv(qkv.size(), 0.25f);
  backend.AttentionBackward(Span(dqkv), Span(dout), Span(qkv), Span(att), B, T, C, NH);
  Vec want = ref::AttentionBackward(ToDouble(dout), ToDouble(qkv), B, T, C, NH);
  for (double& v : want) v += 0.25;  // accumulated
  EXPECT_LT(RelativeError(dqkv, want), 2e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuAttentionTest,
                         ::testing::Values(Shape{1, 1, 8, 2}, Shape{2, 5, 12, 3},
                                           Shape{3, 17, 32, 4}, Shape{2, 33, 64, 1}));

TEST(CpuAttentionReferenceTest, BackwardAgreesWithFiniteDifferences) {
  const int B = 1, T = 4, C = 6, NH = 2;
  const Vec qkv = ToDouble(RandomFloats(B * T * 3 * C, 4, 1.5f));
  const Vec dout = ToDouble(RandomFloats(B * T * C, 5));
  auto objective = [&](const Vec& x) {
    const Vec y = ref::Attention(x, B, T, C, NH);
    double s = 0.0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dout[i];
    return s;
  };
  const Vec grad = ref::AttentionBackward(dout, qkv, B, T, C, NH);
  const double h = 1e-6;
  for (size_t i = 0; i < qkv.size(); ++i) {
    Vec plus = qkv, minus = qkv;
    plus[i] += h;
    minus[i] -= h;
    EXPECT_NEAR(grad[i], (objective(plus) - objective(minus)) / (2 * h), 1e-7) << i;
  }
}

}  // namespace
}  // namespace cohort::compute
