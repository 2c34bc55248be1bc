// kernel_math.h's functions run on the CPU: against the CPU backend's ops,
// bitwise where the backend computes the same operations in the same order,
// otherwise within a tolerance that says why; against double references; and
// at the edges (large |x| for GELU, C = 1, T = 1, odd head sizes, tokens
// outside a vocab shard). GELU, LayerNorm and the index maps here; the
// cross-entropy row and the causal softmax in kernel_math_softmax_test.cc.

#include "worker/compute/kernel_math.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/compute/device_order.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/cpu_backend.h"
#include "worker/compute/cpu_kernels.h"

namespace cohort::compute {
namespace {

namespace km = kernel_math;
using device_order::kLanes;
using device_order::WarpSum;
using ref::Bits;
using ref::RandomFloats;
using ref::RelativeError;
using ref::Span;
using ref::ToDouble;
using ref::Vec;

// ---- GELU ---------------------------------------------------------------------

// Random inputs (a count that is no multiple of the CPU's vector width, so a
// partial vector is in play) and the edges: zeros, subnormals, the points
// where the exponential underflows (x ~ 10) and overflows (x ~ -10.05), and
// magnitudes up to 1e19, the largest whose square is finite.
std::vector<float> GeluInputs() {
  std::vector<float> x = RandomFloats(1003, 1, 8.0f);
  for (float v :
       {0.0f, 1e-30f, 1e-40f, 0.5f, 3.0f, 9.9f, 10.0f, 10.05f, 10.1f, 20.0f, 100.0f, 1e4f, 1e19f}) {
    x.push_back(v);
    x.push_back(-v);
  }
  return x;
}

// The CPU backend's exponential of each element: ScaledExpShifted with shift
// 0 and scale 1 computes exp(x) by the same code, lane for lane, as the
// backend's GELU (x - 0 and e * 1 are exact).
std::vector<float> CpuExp(const std::vector<float>& x) {
  std::vector<float> e(x.size());
  cpu::ScaledExpShifted(e.data(), x.data(), static_cast<int64_t>(x.size()), 0.0f, 1.0f);
  return e;
}

// gelu and gelu' in double, through the logistic form: the tanh form's
// values without its cancellation (1 + tanh(u) for u << 0), which double
// would round to 0 where fp32's formula still has digits.
struct GeluDouble {
  double value;
  double grad;
  double grad_scale;  // |s| + |the second term|: what the derivative's rounding is relative to
};
GeluDouble GeluReference(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double u = k * (x + 0.044715 * x * x * x);
  const double e = std::exp(-2.0 * u);
  const double s = 1.0 / (1.0 + e);
  const double one_minus_s = std::isinf(e) ? 1.0 : e * s;
  const double second = x * 2.0 * s * one_minus_s * k * (1.0 + 3.0 * 0.044715 * x * x);
  return {x * s, s + second, std::fabs(s) + std::fabs(second)};
}

TEST(KernelMathGeluTest, GivenTheCpuBackendsExponentialTheFunctionsGiveItsBits) {
  // The CPU backend's AVX2 GELU spells kernel_math's operations out on
  // vectors (cpu_kernels_vector.cc); given its own exponential they must
  // agree to the bit, the backward's accumulation included.
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> x = GeluInputs();
  const size_t n = x.size();
  std::vector<float> argument(n);
  for (size_t i = 0; i < n; ++i) argument[i] = km::GeluExpArgument(x[i]);
  const std::vector<float> e = CpuExp(argument);

  std::vector<float> out(n), want(n);
  backend.GeluForward(Span(out), Span(x), n);
  for (size_t i = 0; i < n; ++i) want[i] = km::GeluFromExp(x[i], e[i]);
  EXPECT_EQ(Bits(out), Bits(want));

  std::vector<float> dinp = RandomFloats(n, 2), dout = RandomFloats(n, 3);
  std::vector<float> want_dinp = dinp;
  for (size_t i = 0; i < n; ++i) want_dinp[i] += km::GeluGradFromExp(x[i], e[i]) * dout[i];
  backend.GeluBackward(Span(dinp), Span(x), Span(dout), n);
  EXPECT_EQ(Bits(dinp), Bits(want_dinp));
}

TEST(KernelMathGeluTest, WithTheCLibrarysExpTheyMatchDoublePrecision) {
  // The device's formula, with the C library's expf for CUDA's. Its error
  // is rounding carried through the exponential: exp(a) turns a relative
  // error r of its argument a into a relative error |a| r, so the bound is a
  // few ulp times (1 + |a|): over 2M random x in [-12, 12] the worst was 3.1
  // such units, for both functions. Below x ~ -10.05 fp32's exponential
  // overflows and gelu is -0 where the truth is under 1e-37: the absolute
  // floor.
  for (double x : {-5.0, -2.0, -0.75, 0.0, 0.3, 1.0, 4.0}) {  // the reference is the tanh form
    EXPECT_NEAR(GeluReference(x).value, ref::Gelu(x), 1e-12) << x;
    EXPECT_NEAR(GeluReference(x).grad, ref::GeluGrad(x), 1e-12) << x;
  }
  constexpr double kUlp = FLT_EPSILON / 2;
  constexpr double kFloor = 1e-36;
  for (float x : GeluInputs()) {
    const float a = km::GeluExpArgument(x);
    const float e = expf(a);
    const GeluDouble want = GeluReference(x);
    // An infinite argument saturates the exponential exactly (0 or inf).
    const double amplified = std::isinf(a) ? 1.0 : 1.0 + std::fabs(a);
    EXPECT_NEAR(km::GeluFromExp(x, e), want.value,
                6 * kUlp * amplified * std::fabs(want.value) + kFloor)
        << "x " << x;
    EXPECT_NEAR(km::GeluGradFromExp(x, e), want.grad,
                8 * kUlp * amplified * want.grad_scale + kFloor)
        << "x " << x;
  }
}

TEST(KernelMathGeluTest, LargeMagnitudesSaturateExactly) {
  // gelu(x) = x and gelu'(x) = 1 once exp(-2u) is below half an ulp of 1;
  // gelu(x) = -0 and gelu'(x) = 0 once it overflows; finite up to |x| = 1e19.
  // The same with CUDA's formula on the C library's expf and with the CPU
  // backend.
  const std::vector<float> high = {10.0f, 20.0f, 1e4f, 1e19f};
  const std::vector<float> low = {-10.1f, -20.0f, -1e4f, -1e19f};
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  for (std::vector<float> x : {high, low}) {
    std::vector<float> out(x.size()), grad(x.size(), 0.0f), ones(x.size(), 1.0f);
    backend.GeluForward(Span(out), Span(x), x.size());
    backend.GeluBackward(Span(grad), Span(x), Span(ones), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float e = expf(km::GeluExpArgument(x[i]));
      const bool saturates_high = x[i] > 0;
      const std::vector<float> want_value = {saturates_high ? x[i] : -0.0f};
      const float want_grad = saturates_high ? 1.0f : 0.0f;
      EXPECT_EQ(Bits({km::GeluFromExp(x[i], e)}), Bits(want_value)) << x[i];
      EXPECT_EQ(Bits({out[i]}), Bits(want_value)) << x[i];
      EXPECT_EQ(km::GeluGradFromExp(x[i], e), want_grad) << x[i];
      EXPECT_EQ(grad[i], want_grad) << x[i];
    }
  }
}

// ---- LayerNorm ------------------------------------------------------------------

struct LayerNormData {
  int N, C;
  std::vector<float> x, weight, bias, dout;
};

LayerNormData MakeLayerNormData(int N, int C) {
  LayerNormData d{N,
                  C,
                  RandomFloats(N * C, 10 + C, 2.0f),
                  RandomFloats(C, 11 + C),
                  RandomFloats(C, 12 + C),
                  RandomFloats(N * C, 13 + C)};
  for (int c = 0; c < C; ++c) d.x[c] += 10.0f;  // a row with a large mean
  return d;
}

constexpr std::array<std::pair<int, int>, 3> kLayerNormShapes = {{{4, 1}, {5, 37}, {3, 768}}};

// LayerNormForward of (N,C) x from kernel_math's whole-row functions, the
// row sum given (the fused residual's comes with its sums).
template <typename RowSum>
void KernelMathLayerNorm(const std::vector<float>& x, const LayerNormData& d, RowSum row_sum,
                         std::vector<float>* out, std::vector<float>* mean,
                         std::vector<float>* rstd) {
  const int N = d.N, C = d.C;
  out->resize(N * C);
  mean->resize(N);
  rstd->resize(N);
  for (int n = 0; n < N; ++n) {
    const float* row = x.data() + n * C;
    (*mean)[n] = km::RowMean(row_sum(n), C);
    (*rstd)[n] = km::LayerNormRstd(km::StridedSquaredDeviation(row, C, (*mean)[n], 0, 1), C);
    for (int c = 0; c < C; ++c) {
      (*out)[n * C + c] =
          km::LayerNormOutput(row[c], (*mean)[n], (*rstd)[n], d.weight[c], d.bias[c]);
    }
  }
}

TEST(KernelMathLayerNormTest, WholeRowFunctionsGiveTheCpuBackendsBits) {
  // The CPU backend's row is the share with first 0 and stride 1 (serial
  // sums, no fused multiply-add), and its dweight sums the term over rows in
  // order: the same operations, so the same bits.
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  for (const auto& [N, C] : kLayerNormShapes) {
    SCOPED_TRACE(::testing::Message() << "N " << N << " C " << C);
    LayerNormData d = MakeLayerNormData(N, C);
    std::vector<float> out(N * C), mean(N), rstd(N);
    backend.LayerNormForward(Span(out), Span(mean), Span(rstd), Span(d.x), Span(d.weight),
                             Span(d.bias), N, C);
    std::vector<float> want_out, want_mean, want_rstd;
    KernelMathLayerNorm(
        d.x, d, [&](int n) { return km::StridedSum(d.x.data() + n * C, C, 0, 1); }, &want_out,
        &want_mean, &want_rstd);
    EXPECT_EQ(Bits(mean), Bits(want_mean));
    EXPECT_EQ(Bits(rstd), Bits(want_rstd));
    EXPECT_EQ(Bits(out), Bits(want_out));

    // The backward accumulates into what is there.
    std::vector<float> dx = RandomFloats(N * C, 14), dw = RandomFloats(C, 15),
                       db = RandomFloats(C, 16);
    std::vector<float> want_dx = dx, want_dw = dw, want_db = db;
    for (int n = 0; n < N; ++n) {
      const float* row = d.x.data() + n * C;
      const float* dy = d.dout.data() + n * C;
      const km::LayerNormGradSums sums =
          km::StridedLayerNormGradSums(dy, row, d.weight.data(), mean[n], rstd[n], C, 0, 1);
      const float dnorm_mean = km::RowMean(sums.dnorm, C);
      const float dnorm_norm_mean = km::RowMean(sums.dnorm_norm, C);
      for (int c = 0; c < C; ++c) {
        want_dx[n * C + c] += km::LayerNormInputGrad(row[c], d.weight[c], dy[c], mean[n], rstd[n],
                                                     dnorm_mean, dnorm_norm_mean);
      }
    }
    for (int c = 0; c < C; ++c) {
      float acc_w = 0.0f, acc_b = 0.0f;
      for (int n = 0; n < N; ++n) {
        acc_w += km::LayerNormWeightGradTerm(d.x[n * C + c], mean[n], rstd[n], d.dout[n * C + c]);
        acc_b += d.dout[n * C + c];
      }
      want_dw[c] += acc_w;
      want_db[c] += acc_b;
    }
    backend.LayerNormBackward(Span(dx), Span(dw), Span(db), Span(d.dout), Span(d.x), Span(d.weight),
                              Span(mean), Span(rstd), N, C);
    EXPECT_EQ(Bits(dx), Bits(want_dx));
    EXPECT_EQ(Bits(dw), Bits(want_dw));
    EXPECT_EQ(Bits(db), Bits(want_db));
  }
}

TEST(KernelMathLayerNormTest, TheWarpsLaneOrderMatchesDoublePrecision) {
  // The device's order: each of 32 lanes sums its strided share, CUB's tree
  // combines the lanes (device_order.h); C = 1 leaves 31 lanes empty. Other
  // sums than the CPU's, so the CPU backend's own bound against the double
  // reference (2e-6, cpu_kernels_pointwise_test.cc) rather than its bits.
  for (const auto& shape : kLayerNormShapes) {
    const int N = shape.first, C = shape.second;  // plain ints: the lambdas below capture C
    SCOPED_TRACE(::testing::Message() << "N " << N << " C " << C);
    const LayerNormData d = MakeLayerNormData(N, C);
    std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
    for (int n = 0; n < N; ++n) {
      const float* row = d.x.data() + n * C;
      const float* dy = d.dout.data() + n * C;
      const float m =
          km::RowMean(WarpSum([&](int lane) { return km::StridedSum(row, C, lane, kLanes); }), C);
      const float s = km::LayerNormRstd(
          WarpSum([&](int lane) { return km::StridedSquaredDeviation(row, C, m, lane, kLanes); }),
          C);
      for (int c = 0; c < C; ++c)
        out[n * C + c] = km::LayerNormOutput(row[c], m, s, d.weight[c], d.bias[c]);
      std::array<km::LayerNormGradSums, kLanes> shares;
      for (int lane = 0; lane < kLanes; ++lane) {
        shares[lane] =
            km::StridedLayerNormGradSums(dy, row, d.weight.data(), m, s, C, lane, kLanes);
      }
      const float dnorm_mean =
          km::RowMean(WarpSum([&](int lane) { return shares[lane].dnorm; }), C);
      const float dnorm_norm_mean =
          km::RowMean(WarpSum([&](int lane) { return shares[lane].dnorm_norm; }), C);
      for (int c = 0; c < C; ++c) {
        dx[n * C + c] +=
            km::LayerNormInputGrad(row[c], d.weight[c], dy[c], m, s, dnorm_mean, dnorm_norm_mean);
        dw[c] += km::LayerNormWeightGradTerm(row[c], m, s, dy[c]);
      }
      mean[n] = m;
      rstd[n] = s;
    }
    const Vec x = ToDouble(d.x), w = ToDouble(d.weight), b = ToDouble(d.bias);
    EXPECT_LT(RelativeError(out, ref::LayerNorm(x, w, b, N, C)), 2e-6);
    Vec want_dx, want_dw, want_db;
    ref::LayerNormBackward(ToDouble(d.dout), x, w, N, C, &want_dx, &want_dw, &want_db);
    EXPECT_LT(RelativeError(dx, want_dx), 2e-6);
    EXPECT_LT(RelativeError(dw, want_dw), 2e-6);
  }
}

TEST(KernelMathLayerNormTest, TheResidualSumGivesTheCpuResidualAndLayerNormBits) {
  // The fused residual + LayerNorm's first pass: the whole row's share is
  // ResidualForward's sums and StridedSum over them, bitwise; then the
  // LayerNorm's functions over that row give the CPU backend's unfused
  // ResidualForward + LayerNormForward bits.
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  for (const auto& [N, C] : kLayerNormShapes) {
    SCOPED_TRACE(::testing::Message() << "N " << N << " C " << C);
    LayerNormData d = MakeLayerNormData(N, C);
    std::vector<float> other = RandomFloats(N * C, 17 + C);
    std::vector<float> residual(N * C), out(N * C), mean(N), rstd(N);
    backend.ResidualForward(Span(residual), Span(d.x), Span(other), residual.size());
    backend.LayerNormForward(Span(out), Span(mean), Span(rstd), Span(residual), Span(d.weight),
                             Span(d.bias), N, C);
    std::vector<float> fused(N * C), want_out, want_mean, want_rstd;
    // Row n's sums are written (and summed) before row n is normalised.
    KernelMathLayerNorm(
        fused, d,
        [&](int n) {
          return km::StridedResidualSum(fused.data() + n * C, d.x.data() + n * C,
                                        other.data() + n * C, C, 0, 1);
        },
        &want_out, &want_mean, &want_rstd);
    EXPECT_EQ(Bits(fused), Bits(residual));
    EXPECT_EQ(Bits(want_mean), Bits(mean));
    EXPECT_EQ(Bits(want_rstd), Bits(rstd));
    EXPECT_EQ(Bits(want_out), Bits(out));
  }
}

TEST(KernelMathLayerNormTest, TheLanesResidualSumsWriteEveryColumnOnceAndSumTheirShare) {
  // The device's split: lane l writes and sums columns l, l + 32, ...; the
  // lanes together write every column once, and each lane's sum is
  // StridedSum over the columns it wrote (what the kernel's LayerNorm then
  // reads back, by the same lane).
  for (const auto& shape : kLayerNormShapes) {
    const int C = shape.second;
    SCOPED_TRACE(::testing::Message() << "C " << C);
    const std::vector<float> a = RandomFloats(C, 31 + C), b = RandomFloats(C, 32 + C);
    std::vector<float> sum(C, std::nanf(""));
    for (int lane = 0; lane < kLanes; ++lane) {
      const float share = km::StridedResidualSum(sum.data(), a.data(), b.data(), C, lane, kLanes);
      EXPECT_EQ(Bits({share}), Bits({km::StridedSum(sum.data(), C, lane, kLanes)})) << lane;
    }
    for (int c = 0; c < C; ++c) EXPECT_EQ(Bits({sum[c]}), Bits({a[c] + b[c]})) << c;
  }
}

// ---- Index maps -------------------------------------------------------------------

TEST(KernelMathIndexTest, TokenMajorIndexIsTheElementsOffsetInTheTokenMajorLayout) {
  // Odd head sizes, a single head, T = 1 and hs = 1 among the shapes.
  for (const auto& [B, T, NH, hs] :
       std::vector<std::array<int, 4>>{{2, 5, 3, 5}, {1, 1, 2, 3}, {3, 4, 1, 7}, {2, 3, 4, 1}}) {
    SCOPED_TRACE(::testing::Message() << "B " << B << " T " << T << " NH " << NH << " hs " << hs);
    const int C = NH * hs;
    std::vector<int> hits(static_cast<size_t>(B) * T * 3 * C, 0);
    int64_t i = 0;  // the head-major (B,NH,T,hs) index
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < T; ++t)
          for (int d = 0; d < hs; ++d, ++i) {
            ASSERT_EQ(km::TokenMajorIndex(i, T, NH, hs, 1), ((b * T + t) * NH + h) * hs + d);
            const int64_t qkv = km::TokenMajorIndex(i, T, NH, hs, 3);
            ASSERT_EQ(qkv, (((b * T + t) * 3 + 0) * NH + h) * hs + d);
            for (int part = 0; part < 3; ++part) ++hits[qkv + part * C];
          }
    // q, k and v together visit every element of qkv once.
    EXPECT_EQ(hits, std::vector<int>(hits.size(), 1));
  }
}

TEST(KernelMathIndexTest, ShardRowsAndSortKeysGiveTheCpuBackendsEncoderShards) {
  // The device's encoder from kernel_math's maps: the forward picks rows by
  // ShardRow; the backward sorts positions stably by ShardSortKey (tokens
  // outside the shard last, skipped) and adds each token's rows of dout in
  // position order. Both are the CPU backend's sums, term for term: bitwise.
  constexpr int B = 2, T = 6, C = 5, Vp = 40;
  const std::vector<int32_t> inp = {0, 15, 16, 31, 32, 39, 5, 16, 16, 38, 0, 20};
  std::vector<float> wte = RandomFloats(Vp * C, 20), wpe = RandomFloats(T * C, 21),
                     dout = RandomFloats(B * T * C, 22);
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  for (const auto& [vocab_start, Vs] :
       std::vector<std::pair<int, int>>{{0, 16}, {16, 16}, {32, 8}, {0, 40}}) {
    SCOPED_TRACE(::testing::Message() << "shard " << vocab_start << " + " << Vs);
    EXPECT_EQ(km::ShardRow(vocab_start - 1, vocab_start, Vs), -1);
    EXPECT_EQ(km::ShardRow(vocab_start, vocab_start, Vs), 0);
    EXPECT_EQ(km::ShardRow(vocab_start + Vs - 1, vocab_start, Vs), Vs - 1);
    EXPECT_EQ(km::ShardRow(vocab_start + Vs, vocab_start, Vs), -1);
    EXPECT_EQ(km::ShardSortKey(vocab_start + Vs, vocab_start, Vs), static_cast<uint32_t>(Vs));
    std::vector<float> wte_shard(wte.begin() + vocab_start * C,
                                 wte.begin() + (vocab_start + Vs) * C);
    std::vector<int32_t> tokens = inp;
    for (bool with_wpe : {true, false}) {
      std::vector<float> out(B * T * C), want(B * T * C);
      backend.EncoderForwardShard(Span(out), Span(tokens), Span(wte_shard),
                                  with_wpe ? Span(wpe) : TensorSpan{}, vocab_start, Vs, B, T, C);
      for (int bt = 0; bt < B * T; ++bt) {
        const int64_t row = km::ShardRow(inp[bt], vocab_start, Vs);
        for (int c = 0; c < C; ++c) {
          const float* w = row < 0 ? nullptr : &wte_shard[row * C + c];
          const float* p = with_wpe ? &wpe[(bt % T) * C + c] : nullptr;
          want[bt * C + c] = w && p ? *w + *p : w ? *w : p ? *p : -0.0f;
        }
      }
      EXPECT_EQ(Bits(out), Bits(want)) << "with wpe " << with_wpe;
    }
    std::vector<float> dwte = RandomFloats(Vs * C, 23);
    std::vector<float> want_dwte = dwte;
    std::vector<int> order(B * T);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return km::ShardSortKey(inp[a], vocab_start, Vs) < km::ShardSortKey(inp[b], vocab_start, Vs);
    });
    for (int position : order) {
      const uint32_t key = km::ShardSortKey(inp[position], vocab_start, Vs);
      if (key >= static_cast<uint32_t>(Vs)) continue;
      for (int c = 0; c < C; ++c) want_dwte[key * C + c] += dout[position * C + c];
    }
    backend.EncoderBackwardShard(Span(dwte), TensorSpan{}, Span(dout), Span(tokens), vocab_start,
                                 Vs, B, T, C);
    EXPECT_EQ(Bits(dwte), Bits(want_dwte));
  }
}

}  // namespace
}  // namespace cohort::compute
