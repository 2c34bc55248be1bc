// Encoder, LayerNorm, GELU and residual on CpuBackend against double
// references; the references' backward passes against finite differences.

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

constexpr int kB = 3, kT = 7, kC = 40, kVp = 11, kMaxT = 9;

TEST(CpuEncoderTest, ForwardAndBackwardMatchReference) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<int32_t> inp(kB * kT);
  for (int i = 0; i < kB * kT; ++i) inp[i] = (i * 7) % 5;  // repeated ids collide in dwte
  std::vector<float> wte = RandomFloats(kVp * kC, 1), wpe = RandomFloats(kMaxT * kC, 2);
  std::vector<float> out(kB * kT * kC, -1.0f);
  backend.EncoderForward(Span(out), Span(inp), Span(wte), Span(wpe), kB, kT, kC);
  EXPECT_LT(RelativeError(out, ref::Encoder(inp, ToDouble(wte), ToDouble(wpe), kB, kT, kC)), 1e-7);

  // Backward accumulates on top of what is there.
  std::vector<float> dout = RandomFloats(out.size(), 3);
  std::vector<float> dwte(wte.size(), 0.5f), dwpe(wpe.size(), -0.25f);
  backend.EncoderBackward(Span(dwte), Span(dwpe), Span(dout), Span(inp), kB, kT, kC);
  Vec want_dwte(wte.size(), 0.5), want_dwpe(wpe.size(), -0.25);
  for (int b = 0; b < kB; ++b)
    for (int t = 0; t < kT; ++t)
      for (int c = 0; c < kC; ++c) {
        want_dwte[inp[b * kT + t] * kC + c] += dout[(b * kT + t) * kC + c];
        want_dwpe[t * kC + c] += dout[(b * kT + t) * kC + c];
      }
  EXPECT_LT(RelativeError(dwte, want_dwte), 1e-6);
  EXPECT_LT(RelativeError(dwpe, want_dwpe), 1e-6);
  // Rows of wpe beyond T are untouched.
  EXPECT_EQ(dwpe[kT * kC], -0.25f);
}

TEST(CpuLayerNormTest, ForwardMatchesReferenceAndSavesStatistics) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  const int N = kB * kT;
  std::vector<float> x = RandomFloats(N * kC, 4, 2.0f);
  for (int c = 0; c < kC; ++c) x[c] += 10.0f;  // a row with a large mean
  std::vector<float> w = RandomFloats(kC, 5), b = RandomFloats(kC, 6);
  std::vector<float> out(N * kC), mean(N), rstd(N);
  backend.LayerNormForward(Span(out), Span(mean), Span(rstd), Span(x), Span(w), Span(b), N, kC);
  EXPECT_LT(RelativeError(out, ref::LayerNorm(ToDouble(x), ToDouble(w), ToDouble(b), N, kC)), 2e-6);
  double m0 = 0.0;
  for (int c = 0; c < kC; ++c) m0 += x[c];
  EXPECT_NEAR(mean[0], m0 / kC, 1e-5);
}

TEST(CpuLayerNormTest, BackwardMatchesReference) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  const int N = kB * kT;
  std::vector<float> x = RandomFloats(N * kC, 7, 2.0f);
  std::vector<float> w = RandomFloats(kC, 8), b = RandomFloats(kC, 9);
  std::vector<float> out(N * kC), mean(N), rstd(N);
  backend.LayerNormForward(Span(out), Span(mean), Span(rstd), Span(x), Span(w), Span(b), N, kC);
  std::vector<float> dout = RandomFloats(N * kC, 10);
  std::vector<float> dx(N * kC, 1.0f), dw(kC, 2.0f), db(kC, 3.0f);
  backend.LayerNormBackward(Span(dx), Span(dw), Span(db), Span(dout), Span(x), Span(w), Span(mean),
                            Span(rstd), N, kC);
  Vec want_dx, want_dw, want_db;
  ref::LayerNormBackward(ToDouble(dout), ToDouble(x), ToDouble(w), N, kC, &want_dx, &want_dw,
                         &want_db);
  for (double& v : want_dx) v += 1.0;
  for (double& v : want_dw) v += 2.0;
  for (double& v : want_db) v += 3.0;
  EXPECT_LT(RelativeError(dx, want_dx), 2e-6);
  EXPECT_LT(RelativeError(dw, want_dw), 2e-6);
  EXPECT_LT(RelativeError(db, want_db), 2e-6);
}

// Sanity check of the analytic reference itself: central differences of
// sum(dout * LayerNorm(x)) in double.
TEST(CpuLayerNormTest, ReferenceBackwardAgreesWithFiniteDifferences) {
  const int N = 2, C = 6;
  Vec x = ToDouble(RandomFloats(N * C, 11, 2.0f)), w = ToDouble(RandomFloats(C, 12));
  Vec b = ToDouble(RandomFloats(C, 13)), dout = ToDouble(RandomFloats(N * C, 14));
  auto objective = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    const Vec y = ref::LayerNorm(xx, ww, bb, N, C);
    double s = 0.0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dout[i];
    return s;
  };
  Vec dx, dw, db;
  ref::LayerNormBackward(dout, x, w, N, C, &dx, &dw, &db);
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    Vec xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    EXPECT_NEAR(dx[i], (objective(xp, w, b) - objective(xm, w, b)) / (2 * h), 1e-7) << i;
  }
  for (int c = 0; c < C; ++c) {
    Vec wp = w, wm = w, bp = b, bm = b;
    wp[c] += h;
    wm[c] -= h;
    bp[c] += h;
    bm[c] -= h;
    EXPECT_NEAR(dw[c], (objective(x, wp, b) - objective(x, wm, b)) / (2 * h), 1e-7) << c;
    EXPECT_NEAR(db[c], (objective(x, w, bp) - objective(x, w, bm)) / (2 * h), 1e-7) << c;
  }
}

TEST(CpuGeluTest, ForwardAndBackwardMatchReference) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> x = RandomFloats(1000, 15, 6.0f);
  x[0] = 0.0f;
  x[1] = 40.0f;   // cosh overflows: the gradient must still be 1
  x[2] = -40.0f;  // and 0 here
  std::vector<float> y(x.size());
  backend.GeluForward(Span(y), Span(x), x.size());
  Vec want_y(x.size()), want_dx(x.size());
  std::vector<float> dout = RandomFloats(x.size(), 16);
  std::vector<float> dx(x.size(), 0.5f);
  backend.GeluBackward(Span(dx), Span(x), Span(dout), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    want_y[i] = ref::Gelu(x[i]);
    want_dx[i] = 0.5 + ref::GeluGrad(x[i]) * dout[i];
  }
  EXPECT_LT(RelativeError(y, want_y), 1e-6);
  EXPECT_LT(RelativeError(dx, want_dx), 1e-6);
  EXPECT_FLOAT_EQ(dx[1], 0.5f + dout[1]);
  EXPECT_FLOAT_EQ(dx[2], 0.5f);
  for (double v : {-3.0, -0.5, 0.3, 2.0}) {
    const double h = 1e-6;
    EXPECT_NEAR(ref::GeluGrad(v), (ref::Gelu(v + h) - ref::Gelu(v - h)) / (2 * h), 1e-8) << v;
  }
}

TEST(CpuResidualTest, ForwardAddsAndBackwardAccumulatesIntoBoth) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> a = RandomFloats(101, 17), b = RandomFloats(101, 18), out(101);
  backend.ResidualForward(Span(out), Span(a), Span(b), out.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  std::vector<float> d1(101, 1.0f), d2(101, 2.0f);
  backend.ResidualBackward(Span(d1), Span(d2), Span(a), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(d1[i], 1.0f + a[i]);
    EXPECT_EQ(d2[i], 2.0f + a[i]);
  }
}

}  // namespace
}  // namespace cohort::compute
