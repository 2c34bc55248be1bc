// Linear layer on CpuBackend against double references.

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

constexpr int kN = 37, kC = 29, kOC = 23;

TEST(CpuMatmulTest, ForwardWithAndWithoutBias) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> x = RandomFloats(kN * kC, 1), w = RandomFloats(kOC * kC, 2);
  std::vector<float> bias = RandomFloats(kOC, 3);
  std::vector<float> out(kN * kOC, 99.0f);  // overwritten, not accumulated
  backend.MatmulForward(Span(out), Span(x), Span(w), Span(bias), kN, kC, kOC);
  EXPECT_LT(RelativeError(out, ref::Matmul(ToDouble(x), ToDouble(w), ToDouble(bias), kN, kC, kOC)),
            1e-6);
  std::vector<float> out2(kN * kOC, 99.0f);
  backend.MatmulForward(Span(out2), Span(x), Span(w), TensorSpan{}, kN, kC, kOC);
  EXPECT_LT(RelativeError(out2, ref::Matmul(ToDouble(x), ToDouble(w), Vec{}, kN, kC, kOC)), 1e-6);
}

TEST(CpuMatmulTest, BackwardAccumulatesAllThreeGradients) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> x = RandomFloats(kN * kC, 4), w = RandomFloats(kOC * kC, 5);
  std::vector<float> dout = RandomFloats(kN * kOC, 6);
  std::vector<float> dx(kN * kC, 1.0f), dw(kOC * kC, 2.0f), db(kOC, 3.0f);
  backend.MatmulBackward(Span(dx), Span(dw), Span(db), Span(dout), Span(x), Span(w), kN, kC, kOC);
  Vec want_dx(dx.size(), 1.0), want_dw(dw.size(), 2.0), want_db(db.size(), 3.0);
  for (int n = 0; n < kN; ++n)
    for (int o = 0; o < kOC; ++o) {
      const double g = dout[n * kOC + o];
      want_db[o] += g;
      for (int c = 0; c < kC; ++c) {
        want_dx[n * kC + c] += g * w[o * kC + c];
        want_dw[o * kC + c] += g * x[n * kC + c];
      }
    }
  EXPECT_LT(RelativeError(dx, want_dx), 1e-6);
  EXPECT_LT(RelativeError(dw, want_dw), 1e-6);
  EXPECT_LT(RelativeError(db, want_db), 1e-6);
}

TEST(CpuMatmulTest, BackwardWithoutInputGradientOrBias) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  std::vector<float> x = RandomFloats(kN * kC, 7), w = RandomFloats(kOC * kC, 8);
  std::vector<float> dout = RandomFloats(kN * kOC, 9);
  std::vector<float> dw(kOC * kC, 0.0f);
  backend.MatmulBackward(TensorSpan{}, Span(dw), TensorSpan{}, Span(dout), Span(x), Span(w), kN, kC,
                         kOC);
  Vec want_dw(dw.size(), 0.0);
  for (int n = 0; n < kN; ++n)
    for (int o = 0; o < kOC; ++o)
      for (int c = 0; c < kC; ++c) want_dw[o * kC + c] += dout[n * kOC + o] * x[n * kC + c];
  EXPECT_LT(RelativeError(dw, want_dw), 1e-6);
}

TEST(CpuMatmulTest, UndersizedOutputIsAProgrammerError) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  std::vector<float> x(kN * kC), w(kOC * kC), out(kN * kOC - 1);
  EXPECT_DEATH(backend.MatmulForward(Span(out), Span(x), Span(w), TensorSpan{}, kN, kC, kOC),
               "matmul out");
}

}  // namespace
}  // namespace cohort::compute
