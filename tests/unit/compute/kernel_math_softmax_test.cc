// kernel_math.h's softmax rows on the CPU: the cross-entropy row over a
// vocab shard (its column rules, max, sum of exponentials, loss and dlogits)
// against the CPU backend's shard ops and a double reference, and the causal
// attention softmax with the head index maps, composed as the CUDA backend
// composes them, against the CPU backend's attention. Bitwise where the
// backend computes the same operations; otherwise within a tolerance that
// says why. GELU, LayerNorm and the encoder's maps: kernel_math_test.cc.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/compute/device_order.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/cpu_backend.h"
#include "worker/compute/cpu_kernels.h"
#include "worker/compute/gpu_launch_plan.h"
#include "worker/compute/kernel_math.h"

namespace cohort::compute {
namespace {

namespace km = kernel_math;
using device_order::kLanes;
using device_order::WarpMax;
using device_order::WarpSum;
using ref::Bits;
using ref::Columns;
using ref::RandomFloats;
using ref::RelativeError;
using ref::Span;
using ref::ToDouble;

// ---- Cross-entropy over vocab shards ----------------------------------------------

// V 40 of Vp 64 columns in shards of 16: two full shards, one half padding,
// one all padding. Targets in each shard holding real ids, at its edges.
constexpr int kN = 6, kV = 40, kVp = 64, kVs = 16;
const std::vector<int32_t> kTargets = {0, 15, 16, 39, 33, 7};

std::vector<float> Logits() {
  std::vector<float> logits = RandomFloats(kN * kVp, 40, 4.0f);
  // Padding columns that took part would dominate every softmax.
  for (int n = 0; n < kN; ++n) std::fill_n(logits.begin() + n * kVp + kV, kVp - kV, 1000.0f);
  return logits;
}

TEST(KernelMathCrossEntropyTest, ShardColumnsAndTargetColumns) {
  EXPECT_EQ(km::ShardValidColumns(kV, kVs, 0), 16);
  EXPECT_EQ(km::ShardValidColumns(kV, kVs, 32), 8);
  EXPECT_EQ(km::ShardValidColumns(kV, kVs, 48), 0);  // all padding
  EXPECT_EQ(km::ShardValidColumns(kV, kVs, 80), 0);  // past the table
  EXPECT_EQ(km::ShardValidColumns(kV, kVp, 0), kV);  // the whole row
  EXPECT_EQ(km::ShardTargetColumn(16, 16, 16), 0);
  EXPECT_EQ(km::ShardTargetColumn(31, 16, 16), 15);
  EXPECT_EQ(km::ShardTargetColumn(15, 16, 16), -1);  // the shard before
  EXPECT_EQ(km::ShardTargetColumn(32, 16, 16), -1);  // the shard after
  EXPECT_EQ(km::ShardTargetColumn(39, 8, 32), 7);
  EXPECT_EQ(km::ShardTargetColumn(40, 8, 32), -1);  // a padding column is never a target's
  EXPECT_EQ(km::ShardTargetColumn(48, 0, 48), -1);
}

TEST(KernelMathCrossEntropyTest, RowPiecesAgainstTheCpuBackendsShardOps) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> logits = Logits();
  std::vector<int32_t> targets = kTargets;
  std::vector<float> dlosses = RandomFloats(kN, 41);
  // The group's max: every real column of the row.
  std::vector<float> row_max(kN);
  for (int n = 0; n < kN; ++n) row_max[n] = km::StridedMax(logits.data() + n * kVp, kV, 0, 1);

  std::vector<float> group_sums(2 * kN, 0.0f);
  for (int start = 0; start < kVp; start += kVs) {
    SCOPED_TRACE(::testing::Message() << "shard at " << start);
    std::vector<float> shard = Columns(logits, kN, kVp, start, kVs);
    const int valid = km::ShardValidColumns(kV, kVs, start);
    // 1. The shard's max is exact whatever the order: the backend's value
    // (-infinity for the all-padding shard).
    std::vector<float> shard_max(kN);
    backend.CrossEntropyShardMax(Span(shard_max), Span(shard), kN, kV, kVs, start);
    for (int n = 0; n < kN; ++n) {
      EXPECT_EQ(shard_max[n], km::StridedMax(shard.data() + n * kVs, valid, 0, 1));
    }
    // 2. The target logit is picked bitwise; the sum of exponentials uses
    // the C library's expf where the backend has its own exponential and
    // other lanes: each term within 2 ulp, so the sum within a few.
    std::vector<float> sums(2 * kN);
    backend.CrossEntropyShardSums(Span(sums), Span(shard), Span(row_max), Span(targets), kN, kV,
                                  kVs, start);
    for (int n = 0; n < kN; ++n) {
      const float* row = shard.data() + n * kVs;
      const int col = km::ShardTargetColumn(targets[n], valid, start);
      EXPECT_EQ(Bits({sums[kN + n]}), Bits({col < 0 ? 0.0f : row[col]}));
      const float want = static_cast<float>(km::StridedSumExp(row, valid, row_max[n], 0, 1));
      EXPECT_NEAR(sums[n], want, 4 * FLT_EPSILON * want);
      if (valid == 0) {
        EXPECT_EQ(Bits({sums[n]}), Bits({0.0f}));
      }
      group_sums[n] += sums[n];
      group_sums[kN + n] += sums[kN + n];
    }
  }
  // 3. The loss from the group's sums: the backend's bits (the same
  // function), and the double reference.
  std::vector<float> losses(kN), lse(kN);
  backend.CrossEntropyShardFinish(Span(losses), Span(lse), Span(row_max), Span(group_sums), kN);
  for (int n = 0; n < kN; ++n) {
    float loss, want_lse;
    km::StoreLoss(row_max[n], group_sums[n], group_sums[kN + n], &loss, &want_lse);
    EXPECT_EQ(Bits({losses[n]}), Bits({loss}));
    EXPECT_EQ(Bits({lse[n]}), Bits({want_lse}));
  }
  const ref::Vec logits64 = ToDouble(logits);
  EXPECT_LT(RelativeError(losses, ref::CrossEntropy(logits64, targets, kN, kV, kVp)), 1e-6);

  // 4. dlogits: bitwise given the backend's probabilities (its exponential);
  // with the C library's expf within 2 ulp of p <= 1 each; zero padding.
  std::vector<float> dlogits(kN * kVp);
  for (int start = 0; start < kVp; start += kVs) {
    SCOPED_TRACE(::testing::Message() << "shard at " << start);
    std::vector<float> shard = Columns(logits, kN, kVp, start, kVs);
    const int valid = km::ShardValidColumns(kV, kVs, start);
    std::vector<float> dshard(kN * kVs, -1.0f);
    backend.CrossEntropyShardBackward(Span(dshard), Span(shard), Span(lse), Span(targets),
                                      Span(dlosses), kN, kV, kVs, start);
    for (int n = 0; n < kN; ++n) {
      const float* row = shard.data() + n * kVs;
      const int col = km::ShardTargetColumn(targets[n], valid, start);
      std::vector<float> p(kVs, 0.0f), want(kVs, 0.0f);
      cpu::ScaledExpShifted(p.data(), row, valid, lse[n], 1.0f);
      for (int j = 0; j < valid; ++j) want[j] = km::CrossEntropyDlogit(p[j], j == col, dlosses[n]);
      const std::vector<float> got(dshard.begin() + n * kVs, dshard.begin() + (n + 1) * kVs);
      EXPECT_EQ(Bits(got), Bits(want)) << "row " << n;
      for (int j = 0; j < kVs; ++j) {
        EXPECT_NEAR(got[j], km::ShardDlogit(row, j, valid, col, lse[n], dlosses[n]),
                    4 * FLT_EPSILON * std::fabs(dlosses[n]));
        dlogits[n * kVp + start + j] = got[j];
      }
    }
  }
  EXPECT_LT(RelativeError(dlogits, ref::CrossEntropyGrad(logits64, targets, dlosses, kN, kV, kVp)),
            1e-6);
}

TEST(KernelMathCrossEntropyTest, ShardDlogitsAreTheWholeRowsColumnsShifted) {
  // With the same lse, column j of the shard at `start` is column start + j
  // of the whole row, bit for bit; padding columns are +0; the target's -1
  // lands in the one shard that holds it, and in no other (a target outside
  // the shard leaves every column p * dloss).
  std::vector<float> logits = Logits();
  for (int n = 0; n < kN; ++n) {
    const float* full = logits.data() + n * kVp;
    const float lse = 3.5f, dloss = 0.75f;
    const int full_target = km::ShardTargetColumn(kTargets[n], kV, 0);
    int holders = 0;
    for (int start = 0; start < kVp; start += kVs) {
      const int valid = km::ShardValidColumns(kV, kVs, start);
      const int col = km::ShardTargetColumn(kTargets[n], valid, start);
      holders += col >= 0;
      for (int j = 0; j < kVs; ++j) {
        const float got = km::ShardDlogit(full + start, j, valid, col, lse, dloss);
        const float want =
            j < valid ? km::ShardDlogit(full, start + j, kV, full_target, lse, dloss) : 0.0f;
        EXPECT_EQ(Bits({got}), Bits({want})) << "row " << n << " column " << start + j;
        if (j < valid && start + j != kTargets[n]) {
          EXPECT_GT(got, 0.0f);
        }
      }
    }
    EXPECT_EQ(holders, 1) << "row " << n;
  }
}

TEST(KernelMathCrossEntropyTest, TheBlocksThreadSharesCoverTheRow) {
  // The device gives a row's columns to kRowThreads threads, strided; their
  // shares of the max and of the double sum make up the whole row's.
  constexpr int kThreads = gpu_plan::kRowThreads;
  constexpr int kColumns = 1000;  // 3 or 4 columns a thread
  const std::vector<float> row = RandomFloats(kColumns, 42, 6.0f);
  const float whole_max = km::StridedMax(row.data(), kColumns, 0, 1);
  float max = -INFINITY;
  double sum = 0.0;
  for (int thread = 0; thread < kThreads; ++thread) {
    max = std::max(max, km::StridedMax(row.data(), kColumns, thread, kThreads));
    sum += km::StridedSumExp(row.data(), kColumns, whole_max, thread, kThreads);
  }
  EXPECT_EQ(max, whole_max);
  const double whole_sum = km::StridedSumExp(row.data(), kColumns, whole_max, 0, 1);
  EXPECT_NEAR(sum, whole_sum, 1e-12 * whole_sum);  // doubles of fp32 terms, in other orders
  EXPECT_NEAR(sum, cpu::SumExpShifted(row.data(), kColumns, whole_max), 1e-6 * whole_sum);
}

// ---- Causal attention -----------------------------------------------------------

struct AttentionShape {
  int B, T, NH, hs;
};

class KernelMathAttentionTest : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(KernelMathAttentionTest, TheDevicesPiecesReproduceTheCpuBackend) {
  // The CUDA backend's attention, on the host: SplitQkv by TokenMajorIndex,
  // the scores (cuBLAS's products, here plain loops), the causal softmax one
  // warp per row (CausalColumns, the lanes' StridedMax and
  // StridedExpShiftedSum), the values, MergeHeads; and the backward through
  // StridedDot, SoftmaxInputGrad and AccumulateQkvGrad's map. Against the
  // CPU backend, which takes its heads by leading dimensions from qkv
  // directly: other product orders and another exponential, each a few ulp,
  // so 1e-5; a wrong index map or bound is off by O(1).
  const AttentionShape shape = GetParam();
  const int B = shape.B, T = shape.T, NH = shape.NH, hs = shape.hs;
  const int C = NH * hs;
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  const int64_t heads = rows * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> qkv = RandomFloats(B * T * 3 * C, 50 + T, 1.5f);
  std::vector<float> q(heads), k(heads), v(heads);
  for (int64_t i = 0; i < heads; ++i) {
    const int64_t src = km::TokenMajorIndex(i, T, NH, hs, 3);
    q[i] = qkv[src];
    k[i] = qkv[src + C];
    v[i] = qkv[src + 2 * C];
  }
  // Row r of att is query t = r % T of the pair bh = r / T; element (bh, t, d)
  // of a head array is at (bh * T + t) * hs + d.
  auto product = [&](const std::vector<float>& a, int64_t a_row, const std::vector<float>& b,
                     int64_t b_row) {
    float acc = 0.0f;
    for (int d = 0; d < hs; ++d) acc += a[a_row * hs + d] * b[b_row * hs + d];
    return acc;
  };
  std::vector<float> att(rows * T);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bh = r / T;
    float* row = att.data() + r * T;
    for (int u = 0; u < T; ++u) row[u] = scale * product(q, r, k, bh * T + u);
    const int valid = km::CausalColumns(r, T);
    ASSERT_EQ(valid, r % T + 1);
    const float max = WarpMax([&](int lane) { return km::StridedMax(row, valid, lane, kLanes); });
    const float inv = 1.0f / WarpSum([&](int lane) {
                        return km::StridedExpShiftedSum(row, valid, max, lane, kLanes);
                      });
    for (int j = 0; j < T; ++j) row[j] = j < valid ? row[j] * inv : 0.0f;
  }
  std::vector<float> out(B * T * C);
  for (int64_t i = 0; i < heads; ++i) {
    const int64_t r = i / hs;  // the row of att of this query
    const int d = static_cast<int>(i % hs);
    float acc = 0.0f;
    for (int u = 0; u < T; ++u) acc += att[r * T + u] * v[((r / T) * T + u) * hs + d];
    out[km::TokenMajorIndex(i, T, NH, hs, 1)] = acc;
  }
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> cpu_out(B * T * C), cpu_att(rows * T);
  backend.AttentionForward(Span(cpu_out), Span(cpu_att), Span(qkv), B, T, C, NH);
  EXPECT_LT(RelativeError(out, ToDouble(cpu_out)), 1e-5);
  EXPECT_LT(RelativeError(out, ref::Attention(ToDouble(qkv), B, T, C, NH)), 1e-5);
  EXPECT_LT(RelativeError(att, ToDouble(cpu_att)), 1e-5);
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = km::CausalColumns(r, T); j < T; ++j) {
      ASSERT_EQ(Bits({att[r * T + j]}), Bits({cpu_att[r * T + j]})) << "masked " << r << "," << j;
    }
  }

  // Backward: SplitHeads of dout, datt = dout v^T, dv = att^T dout, the
  // softmax's backward per row, dq = scale datt k, dk = scale datt^T q.
  std::vector<float> dout = RandomFloats(B * T * C, 51);
  std::vector<float> dy(heads), datt(rows * T), dq(heads), dk(heads), dv(heads, 0.0f);
  for (int64_t i = 0; i < heads; ++i) dy[i] = dout[km::TokenMajorIndex(i, T, NH, hs, 1)];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bh = r / T;
    float* drow = datt.data() + r * T;
    const float* arow = att.data() + r * T;
    for (int u = 0; u < T; ++u) {
      drow[u] = product(dy, r, v, bh * T + u);
      for (int d = 0; d < hs; ++d) dv[(bh * T + u) * hs + d] += arow[u] * dy[r * hs + d];
    }
    const int valid = km::CausalColumns(r, T);
    const float dot =
        WarpSum([&](int lane) { return km::StridedDot(arow, drow, valid, lane, kLanes); });
    for (int j = 0; j < T; ++j)
      drow[j] = j < valid ? km::SoftmaxInputGrad(arow[j], drow[j], dot) : 0.0f;
  }
  for (int64_t i = 0; i < heads; ++i) {
    const int64_t r = i / hs, bh = r / T;
    const int t = static_cast<int>(r % T), d = static_cast<int>(i % hs);
    float acc_q = 0.0f, acc_k = 0.0f;
    for (int u = 0; u < T; ++u) {
      acc_q += datt[r * T + u] * k[(bh * T + u) * hs + d];
      acc_k += datt[(bh * T + u) * T + t] * q[(bh * T + u) * hs + d];
    }
    dq[i] = scale * acc_q;
    dk[i] = scale * acc_k;
  }
  std::vector<float> dqkv = RandomFloats(qkv.size(), 52, 0.5f);
  std::vector<float> cpu_dqkv = dqkv;
  ref::Vec want_dqkv = ref::AttentionBackward(ToDouble(dout), ToDouble(qkv), B, T, C, NH);
  for (size_t i = 0; i < want_dqkv.size(); ++i) want_dqkv[i] += dqkv[i];
  for (int64_t i = 0; i < heads; ++i) {
    const int64_t dst = km::TokenMajorIndex(i, T, NH, hs, 3);
    dqkv[dst] += dq[i];
    dqkv[dst + C] += dk[i];
    dqkv[dst + 2 * C] += dv[i];
  }
  backend.AttentionBackward(Span(cpu_dqkv), Span(dout), Span(qkv), Span(cpu_att), B, T, C, NH);
  EXPECT_LT(RelativeError(dqkv, ToDouble(cpu_dqkv)), 1e-5);
  // The CPU backend's softmax backward is the same function: the double
  // reference is what tells a wrong formula.
  EXPECT_LT(RelativeError(dqkv, want_dqkv), 1e-5);
}

// Odd head sizes, T = 1 (a softmax over one column), one head, and T above
// the warp's 32 lanes (lanes with two columns) and below (lanes with none).
INSTANTIATE_TEST_SUITE_P(Shapes, KernelMathAttentionTest,
                         ::testing::Values(AttentionShape{2, 5, 3, 5}, AttentionShape{2, 1, 2, 3},
                                           AttentionShape{1, 9, 1, 7},
                                           AttentionShape{1, 40, 2, 3}));

}  // namespace
}  // namespace cohort::compute
