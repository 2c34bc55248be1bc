// Vocab-parallel encoder and cross-entropy on CpuBackend: the shards of a
// table, combined as a tensor group would combine them (emulated on the
// host), against the unsharded ops (bitwise, for the encoder) and against a
// double reference (the loss).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::compute {
namespace {

using ref::Bits;
using ref::Columns;
using ref::RandomFloats;
using ref::Span;
using ref::ToDouble;
using ref::Vec;

// Rows [row0, row0 + rows) of a row-major matrix with `width` columns.
std::vector<float> Rows(const std::vector<float>& m, int row0, int rows, int width) {
  return std::vector<float>(m.begin() + int64_t{row0} * width,
                            m.begin() + int64_t{row0 + rows} * width);
}

// ---- Encoder ------------------------------------------------------------------

constexpr int kB = 3, kT = 7, kC = 40, kVp = 256, kMaxT = 9;

class EncoderShardTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    inp_.resize(kB * kT);
    for (int i = 0; i < kB * kT; ++i) inp_[i] = (i * 37 + 5) % kVp;
    // Shard edges for 2 and 4 shards, and a repeated id (rows collide in dwte).
    inp_[0] = 0;
    inp_[1] = 63;
    inp_[2] = 64;
    inp_[3] = 127;
    inp_[4] = 128;
    inp_[5] = kVp - 1;
    inp_[6] = 63;
    inp_[kT + 2] = 63;
    wte_ = RandomFloats(kVp * kC, 11);
    wpe_ = RandomFloats(kMaxT * kC, 12);
    // wte + wpe = -0 here: summing +0 for an absent term would make it +0.
    wte_[63 * kC + 1] = -0.0f;
    wpe_[1 * kC + 1] = -0.0f;
  }

  std::vector<int32_t> inp_;
  std::vector<float> wte_, wpe_;
};

TEST_P(EncoderShardTest, SumOfShardOutputsIsEncoderForwardBitwise) {
  const int shards = GetParam(), Vs = kVp / shards, wpe_shard = shards - 1;
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> want(kB * kT * kC);
  backend.EncoderForward(Span(want), Span(inp_), Span(wte_), Span(wpe_), kB, kT, kC);
  ASSERT_EQ(Bits({want[kC + 1]}), Bits({-0.0f}));  // the -0 case is exercised

  std::vector<std::vector<float>> outs(shards, std::vector<float>(want.size(), 7.0f));
  for (int s = 0; s < shards; ++s) {
    std::vector<float> wte_s = Rows(wte_, s * Vs, Vs, kC);
    backend.EncoderForwardShard(Span(outs[s]), Span(inp_), Span(wte_s),
                                s == wpe_shard ? Span(wpe_) : TensorSpan{}, s * Vs, Vs, kB, kT, kC);
  }
  // A tensor group may add in any order: forwards and backwards agree.
  std::vector<float> forward = outs[0], backward = outs[shards - 1];
  for (int s = 1; s < shards; ++s) {
    for (size_t i = 0; i < want.size(); ++i) {
      forward[i] += outs[s][i];
      backward[i] += outs[shards - 1 - s][i];
    }
  }
  EXPECT_EQ(Bits(forward), Bits(want));
  EXPECT_EQ(Bits(backward), Bits(want));
}

TEST_P(EncoderShardTest, ConcatenatedShardGradientsAreEncoderBackwardBitwise) {
  const int shards = GetParam(), Vs = kVp / shards, wpe_shard = 0;
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  const std::vector<float> dout = RandomFloats(kB * kT * kC, 13);
  // Gradients accumulate onto what is there.
  const std::vector<float> dwte0 = RandomFloats(wte_.size(), 14);
  const std::vector<float> dwpe0 = RandomFloats(wpe_.size(), 15);
  std::vector<float> want_dwte = dwte0, want_dwpe = dwpe0, dout_copy = dout;
  backend.EncoderBackward(Span(want_dwte), Span(want_dwpe), Span(dout_copy), Span(inp_), kB, kT,
                          kC);

  std::vector<float> dwte, dwpe = dwpe0;
  for (int s = 0; s < shards; ++s) {
    std::vector<float> dwte_s = Rows(dwte0, s * Vs, Vs, kC);
    backend.EncoderBackwardShard(Span(dwte_s), s == wpe_shard ? Span(dwpe) : TensorSpan{},
                                 Span(dout_copy), Span(inp_), s * Vs, Vs, kB, kT, kC);
    dwte.insert(dwte.end(), dwte_s.begin(), dwte_s.end());
  }
  EXPECT_EQ(Bits(dwte), Bits(want_dwte));
  EXPECT_EQ(Bits(dwpe), Bits(want_dwpe));
  // Row 63 collected three positions; a row no token uses is untouched.
  EXPECT_NE(dwte[63 * kC], dwte0[63 * kC]);
  EXPECT_EQ(dwte[1 * kC], dwte0[1 * kC]);
}

INSTANTIATE_TEST_SUITE_P(Shards, EncoderShardTest, ::testing::Values(1, 2, 4));

TEST(EncoderShardEdgeTest, ShardWithoutTheTokensAndWithoutWpeWritesNegativeZero) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  std::vector<int32_t> inp = {0, 1, 2, 3};
  std::vector<float> wte = RandomFloats(4 * kC, 16);  // rows 4..7 of the vocab
  std::vector<float> out(inp.size() * kC, 5.0f);
  backend.EncoderForwardShard(Span(out), Span(inp), Span(wte), TensorSpan{}, 4, 4, 1, 4, kC);
  EXPECT_EQ(Bits(out), Bits(std::vector<float>(out.size(), -0.0f)));
  std::vector<float> dwte = wte, dout = RandomFloats(out.size(), 17);
  backend.EncoderBackwardShard(Span(dwte), TensorSpan{}, Span(dout), Span(inp), 4, 4, 1, 4, kC);
  EXPECT_EQ(Bits(dwte), Bits(wte));
}

// ---- Cross-entropy --------------------------------------------------------------

// Enough rows that every shard's loops run on more than one thread
// (cpu_kernels.h kMinParallelWork).
constexpr int kN = 1200, kV = 250, kCeVp = 256;

struct ShardedLoss {
  std::vector<float> losses, lse, dlogits;  // dlogits (N,Vp), the shards side by side
};

// One tensor group of `shards` ranks, each with its own backend, emulated on
// the host: max and sum over the group between the steps.
ShardedLoss RunShardedCrossEntropy(int shards, int threads, const std::vector<float>& logits,
                                   std::vector<int32_t>& targets, std::vector<float>& dlosses) {
  const int Vs = kCeVp / shards;
  CpuBackend backend(CpuBackendOptions{.num_threads = threads});
  std::vector<std::vector<float>> shard_logits(shards);
  for (int s = 0; s < shards; ++s) shard_logits[s] = Columns(logits, kN, kCeVp, s * Vs, Vs);

  std::vector<float> row_max(kN, -HUGE_VALF);
  for (int s = 0; s < shards; ++s) {
    std::vector<float> part(kN, 1.0f);
    backend.CrossEntropyShardMax(Span(part), Span(shard_logits[s]), kN, kV, Vs, s * Vs);
    for (int n = 0; n < kN; ++n) row_max[n] = std::max(row_max[n], part[n]);
  }
  std::vector<float> sums(2 * kN, 0.0f);
  for (int s = 0; s < shards; ++s) {
    std::vector<float> part(2 * kN, 1.0f);
    backend.CrossEntropyShardSums(Span(part), Span(shard_logits[s]), Span(row_max), Span(targets),
                                  kN, kV, Vs, s * Vs);
    for (int i = 0; i < 2 * kN; ++i) sums[i] += part[i];
  }
  ShardedLoss result{std::vector<float>(kN), std::vector<float>(kN), {}};
  backend.CrossEntropyShardFinish(Span(result.losses), Span(result.lse), Span(row_max), Span(sums),
                                  kN);
  std::vector<std::vector<float>> dshard(shards);
  for (int s = 0; s < shards; ++s) {
    dshard[s].assign(int64_t{kN} * Vs, 123.0f);  // written, not accumulated
    backend.CrossEntropyShardBackward(Span(dshard[s]), Span(shard_logits[s]), Span(result.lse),
                                      Span(targets), Span(dlosses), kN, kV, Vs, s * Vs);
  }
  result.dlogits.resize(int64_t{kN} * kCeVp);
  for (int s = 0; s < shards; ++s)
    for (int n = 0; n < kN; ++n)
      std::copy_n(dshard[s].begin() + int64_t{n} * Vs, Vs,
                  result.dlogits.begin() + int64_t{n} * kCeVp + s * Vs);
  return result;
}

class CrossEntropyShardTest : public ::testing::TestWithParam<int> {};

TEST_P(CrossEntropyShardTest, MatchesDoubleReferenceAndIsThreadCountIndependent) {
  const int shards = GetParam();
  // A large spread: exp without the max shift overflows.
  std::vector<float> logits = RandomFloats(int64_t{kN} * kCeVp, 21, 30.0f);
  // Padding columns would dominate the softmax if they took part.
  for (int n = 0; n < kN; ++n)
    for (int i = kV; i < kCeVp; ++i) logits[n * kCeVp + i] = 1000.0f;
  logits[5 * kCeVp + 200] = 85.0f;  // one row's max far above the others
  std::vector<int32_t> targets(kN);
  for (int n = 0; n < kN; ++n) targets[n] = (n * 37 + 11) % kV;
  targets[0] = 0;
  targets[1] = 63;
  targets[2] = 64;
  targets[3] = kV - 1;
  targets[5] = 200;  // the target is the max
  std::vector<float> dlosses = RandomFloats(kN, 22, 0.5f);
  for (float& d : dlosses) d += 1.0f;

  const ShardedLoss one = RunShardedCrossEntropy(shards, 1, logits, targets, dlosses);
  const ShardedLoss two = RunShardedCrossEntropy(shards, 2, logits, targets, dlosses);
  EXPECT_EQ(Bits(one.losses), Bits(two.losses));
  EXPECT_EQ(Bits(one.lse), Bits(two.lse));
  EXPECT_EQ(Bits(one.dlogits), Bits(two.dlogits));

  const Vec x = ToDouble(logits);
  const Vec want_lse = ref::LogSumExp(x, kN, kV, kCeVp);
  const Vec want_losses = ref::CrossEntropy(x, targets, kN, kV, kCeVp);
  const Vec want_dlogits = ref::CrossEntropyGrad(x, targets, dlosses, kN, kV, kCeVp);
  for (int n = 0; n < kN; ++n) {
    EXPECT_NEAR(one.lse[n], want_lse[n], 1e-6 * std::abs(want_lse[n])) << n;
    // Relative, with an absolute floor: a loss far below one ulp of lse (row
    // 5's is 1e-22) is lse - target rounded, 0 here as in any fp32 loss.
    EXPECT_NEAR(one.losses[n], want_losses[n], 1e-6 * std::max(1.0, std::abs(want_losses[n]))) << n;
  }
  for (int n = 0; n < kN; ++n) {
    for (int i = 0; i < kV; ++i) {
      ASSERT_NEAR(one.dlogits[n * kCeVp + i], want_dlogits[n * kCeVp + i], 1e-6)
          << "row " << n << " column " << i;
    }
    for (int i = kV; i < kCeVp; ++i) ASSERT_EQ(Bits({one.dlogits[n * kCeVp + i]}), Bits({0.0f}));
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, CrossEntropyShardTest, ::testing::Values(1, 2, 4));

TEST(CrossEntropyShardEdgeTest, ShardEntirelyInThePaddingContributesNothing) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  constexpr int N = 7, V = 40, Vs = 16, vocab_start = 48;  // ids 48..63 >= V
  std::vector<float> logits = RandomFloats(N * Vs, 31, 30.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 5) % V;
  std::vector<float> row_max(N, 1.0f), sums(2 * N, 1.0f);
  backend.CrossEntropyShardMax(Span(row_max), Span(logits), N, V, Vs, vocab_start);
  for (float m : row_max) EXPECT_EQ(m, -HUGE_VALF);
  std::vector<float> global_max(N, 3.0f);  // the group's max comes from other shards
  backend.CrossEntropyShardSums(Span(sums), Span(logits), Span(global_max), Span(targets), N, V, Vs,
                                vocab_start);
  EXPECT_EQ(Bits(sums), Bits(std::vector<float>(2 * N, 0.0f)));
  std::vector<float> lse(N, 2.0f), dlosses(N, 1.0f), dlogits(N * Vs, 123.0f);
  backend.CrossEntropyShardBackward(Span(dlogits), Span(logits), Span(lse), Span(targets),
                                    Span(dlosses), N, V, Vs, vocab_start);
  EXPECT_EQ(Bits(dlogits), Bits(std::vector<float>(N * Vs, 0.0f)));
}

TEST(CrossEntropyShardEdgeTest, FinishIsLogOfTheSumMinusTheTargetLogit) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  std::vector<float> row_max = {2.0f, -1.0f}, sums = {1.5f, 4.0f, 0.25f, -3.0f};
  std::vector<float> losses(2), lse(2);
  backend.CrossEntropyShardFinish(Span(losses), Span(lse), Span(row_max), Span(sums), 2);
  EXPECT_FLOAT_EQ(lse[0], 2.0f + std::log(1.5f));
  EXPECT_FLOAT_EQ(lse[1], -1.0f + std::log(4.0f));
  EXPECT_FLOAT_EQ(losses[0], 2.0f + std::log(1.5f) - 0.25f);
  EXPECT_FLOAT_EQ(losses[1], -1.0f + std::log(4.0f) + 3.0f);
}

}  // namespace
}  // namespace cohort::compute
