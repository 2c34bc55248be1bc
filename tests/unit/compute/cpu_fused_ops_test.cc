// The fused ops of backend.h on the CPU give exactly the bits of the
// unfused sequences they replace (the CPU path is compared with PyTorch to
// 1e-7 and must not move), at one and at several threads; the cross-entropy
// backward gives the same bits in place (dlogits = logits) as apart.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::compute {
namespace {

using ref::Bits;
using ref::RandomFloats;
using ref::Span;

// Odd sizes: N not a multiple of 8 (the vector kernels' tails), C and OC
// not multiples of the channel blocks; OC = 4C like the MLP's.
constexpr int kN = 37, kC = 29, kOC = 4 * kC;

struct ThreadCount : ::testing::TestWithParam<int> {};

TEST_P(ThreadCount, MatmulGeluForwardIsMatmulThenGelu) {
  CpuBackend backend(CpuBackendOptions{.num_threads = GetParam()});
  std::vector<float> inp = RandomFloats(kN * kC, 1, 2.0f);
  std::vector<float> weight = RandomFloats(kOC * kC, 2);
  std::vector<float> bias = RandomFloats(kOC, 3);
  for (const bool with_bias : {true, false}) {
    const TensorSpan b = with_bias ? Span(bias) : TensorSpan{};
    std::vector<float> pre(kN * kOC), out(kN * kOC);
    backend.MatmulForward(Span(pre), Span(inp), Span(weight), b, kN, kC, kOC);
    backend.GeluForward(Span(out), Span(pre), pre.size());
    // Stale values in the outputs: the fused op writes, it does not add.
    std::vector<float> fused_pre = RandomFloats(kN * kOC, 4), fused_out = RandomFloats(kN * kOC, 5);
    backend.MatmulGeluForward(Span(fused_out), Span(fused_pre), Span(inp), Span(weight), b, kN, kC,
                              kOC);
    EXPECT_EQ(Bits(fused_pre), Bits(pre)) << "bias " << with_bias;
    EXPECT_EQ(Bits(fused_out), Bits(out)) << "bias " << with_bias;
  }
}

TEST_P(ThreadCount, MatmulGeluBackwardIsTheUnfusedSequence) {
  CpuBackend backend(CpuBackendOptions{.num_threads = GetParam()});
  // The MLP's fcproj: act = gelu(pre) (N, 4C) -> dout (N, C); weight (C, 4C).
  const int N = kN, C = kOC, OC = kC;
  std::vector<float> pre = RandomFloats(N * C, 11, 3.0f);
  std::vector<float> act(N * C);
  backend.GeluForward(Span(act), Span(pre), act.size());
  std::vector<float> weight = RandomFloats(OC * C, 12);
  std::vector<float> dout = RandomFloats(N * OC, 13);
  // Gradients that already hold something: they accumulate.
  const std::vector<float> dweight0 = RandomFloats(OC * C, 14);
  const std::vector<float> dbias0 = RandomFloats(OC, 15);
  const std::vector<float> dpre_bias0 = RandomFloats(C, 16);
  for (const bool with_biases : {true, false}) {
    // The model's sequence before the fusion.
    std::vector<float> dweight = dweight0, dbias = dbias0, dpre_bias = dpre_bias0;
    std::vector<float> dact(N * C), dpre(N * C);
    backend.Zero(Span(dact));
    backend.MatmulBackward(Span(dact), Span(dweight), with_biases ? Span(dbias) : TensorSpan{},
                           Span(dout), Span(act), Span(weight), N, C, OC);
    backend.Zero(Span(dpre));
    backend.GeluBackward(Span(dpre), Span(pre), Span(dact), dpre.size());
    // The fc's bias gradient, as its MatmulBackward took it (dinp unused;
    // a throwaway dweight).
    std::vector<float> unused_dweight(C * OC), fc_weight(C * OC), ln(N * OC);
    if (with_biases) {
      backend.MatmulBackward(TensorSpan{}, Span(unused_dweight), Span(dpre_bias), Span(dpre),
                             Span(ln), Span(fc_weight), N, OC, C);
    }
    std::vector<float> f_dweight = dweight0, f_dbias = dbias0, f_dpre_bias = dpre_bias0;
    std::vector<float> f_dpre = RandomFloats(N * C, 17);  // stale: written over
    backend.MatmulGeluBackward(Span(f_dpre), with_biases ? Span(f_dpre_bias) : TensorSpan{},
                               Span(f_dweight), with_biases ? Span(f_dbias) : TensorSpan{},
                               Span(dout), Span(act), Span(pre), Span(weight), N, C, OC);
    EXPECT_EQ(Bits(f_dpre), Bits(dpre)) << "biases " << with_biases;
    EXPECT_EQ(Bits(f_dweight), Bits(dweight)) << "biases " << with_biases;
    EXPECT_EQ(Bits(f_dbias), Bits(dbias)) << "biases " << with_biases;
    EXPECT_EQ(Bits(f_dpre_bias), Bits(dpre_bias)) << "biases " << with_biases;
  }
}

TEST_P(ThreadCount, ResidualLayerNormForwardIsResidualThenLayerNorm) {
  CpuBackend backend(CpuBackendOptions{.num_threads = GetParam()});
  std::vector<float> a = RandomFloats(kN * kC, 21), b = RandomFloats(kN * kC, 22, 0.5f);
  std::vector<float> weight = RandomFloats(kC, 23), bias = RandomFloats(kC, 24);
  std::vector<float> residual(kN * kC), out(kN * kC), mean(kN), rstd(kN);
  backend.ResidualForward(Span(residual), Span(a), Span(b), residual.size());
  backend.LayerNormForward(Span(out), Span(mean), Span(rstd), Span(residual), Span(weight),
                           Span(bias), kN, kC);
  std::vector<float> f_residual = RandomFloats(kN * kC, 25), f_out = RandomFloats(kN * kC, 26);
  std::vector<float> f_mean = RandomFloats(kN, 27), f_rstd = RandomFloats(kN, 28);
  backend.ResidualLayerNormForward(Span(f_residual), Span(f_out), Span(f_mean), Span(f_rstd),
                                   Span(a), Span(b), Span(weight), Span(bias), kN, kC);
  EXPECT_EQ(Bits(f_residual), Bits(residual));
  EXPECT_EQ(Bits(f_out), Bits(out));
  EXPECT_EQ(Bits(f_mean), Bits(mean));
  EXPECT_EQ(Bits(f_rstd), Bits(rstd));
}

TEST_P(ThreadCount, CrossEntropyBackwardInPlaceGivesTheBitsOfApart) {
  CpuBackend backend(CpuBackendOptions{.num_threads = GetParam()});
  constexpr int N = 9, V = 53, Vp = 64;
  std::vector<float> logits = RandomFloats(N * Vp, 31, 4.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 17 + 3) % V;
  std::vector<float> losses(N), lse(N), dlosses(N, 1.0f / N);
  backend.CrossEntropyForward(Span(losses), Span(lse), Span(logits), Span(targets), N, V, Vp);
  std::vector<float> apart(N * Vp);
  backend.CrossEntropyBackward(Span(apart), Span(logits), Span(lse), Span(targets), Span(dlosses),
                               N, V, Vp);
  std::vector<float> in_place = logits;
  backend.CrossEntropyBackward(Span(in_place), Span(in_place), Span(lse), Span(targets),
                               Span(dlosses), N, V, Vp);
  EXPECT_EQ(Bits(in_place), Bits(apart));
  // A shard of the vocabulary (padding columns included, targets in and out
  // of it) likewise.
  constexpr int kStart = 32, kVs = 32;
  std::vector<float> shard(N * kVs);
  for (int n = 0; n < N; ++n) {
    std::copy_n(logits.begin() + n * Vp + kStart, kVs, shard.begin() + n * kVs);
  }
  std::vector<float> shard_apart(N * kVs);
  backend.CrossEntropyShardBackward(Span(shard_apart), Span(shard), Span(lse), Span(targets),
                                    Span(dlosses), N, V, kVs, kStart);
  backend.CrossEntropyShardBackward(Span(shard), Span(shard), Span(lse), Span(targets),
                                    Span(dlosses), N, V, kVs, kStart);
  EXPECT_EQ(Bits(shard), Bits(shard_apart));
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadCount, ::testing::Values(1, 3));

TEST(CpuFusedOpsTest, ALogitsGradientThatPartlyOverlapsTheLogitsIsRefused) {
  CpuBackend backend;
  constexpr int N = 2, V = 8, Vp = 8;
  std::vector<float> buffer(N * Vp + 4);
  std::vector<float> lse(N), dlosses(N, 1.0f);
  std::vector<int32_t> targets(N, 1);
  const TensorSpan logits = Span(buffer).Slice(0, N * Vp);
  const TensorSpan shifted = Span(buffer).Slice(4, N * Vp);
  EXPECT_DEATH(backend.CrossEntropyBackward(shifted, logits, Span(lse), Span(targets),
                                            Span(dlosses), N, V, Vp),
               "overlaps");
}

TEST(CpuFusedOpsTest, AResidualSumOverItsOwnInputIsRefused) {
  CpuBackend backend;
  std::vector<float> a(8), b(8), out(8), mean(2), rstd(2), w(4), bias(4);
  EXPECT_DEATH(backend.ResidualLayerNormForward(Span(a), Span(out), Span(mean), Span(rstd), Span(a),
                                                Span(b), Span(w), Span(bias), 2, 4),
               "residual_out");
}

}  // namespace
}  // namespace cohort::compute
