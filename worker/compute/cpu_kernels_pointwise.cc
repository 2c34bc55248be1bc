// Encoder, LayerNorm, GELU and residual kernels (fp32, OpenMP). See
// cpu_kernels.h for the determinism rules every loop here follows.

#include <algorithm>
#include <cstdint>

#include "worker/compute/cpu_kernels.h"
#include "worker/compute/kernel_math.h"

namespace cohort::compute::cpu {
namespace {

// Channel gradients (dbias, LayerNorm dweight, dwte) are reduced over rows.
// Threads own disjoint blocks of channels and walk the rows in order, so each
// channel's sum is the same serial sum whatever the thread count.
constexpr int kChannelBlock = 16;

// GELU runs over fixed blocks of elements (a multiple of the vector width),
// handed to the row primitives of cpu_kernels_vector.cc.
constexpr int64_t kPointwiseBlock = 4096;

// The per-row and per-element math is the CUDA kernels' too (kernel_math.h):
// a row here is the shard of it with first 0 and stride 1.
using kernel_math::LayerNormGradSums;
using kernel_math::LayerNormInputGrad;
using kernel_math::LayerNormOutput;
using kernel_math::LayerNormRstd;
using kernel_math::LayerNormWeightGradTerm;
using kernel_math::RowMean;
using kernel_math::ShardRow;
using kernel_math::StridedLayerNormGradSums;
using kernel_math::StridedSquaredDeviation;
using kernel_math::StridedSum;

}  // namespace

void EncoderForwardShard(float* out, const int32_t* inp, const float* wte, const float* wpe,
                         int vocab_start, int Vs, int B, int T, int C, int threads) {
  // out (B,T,C), inp (B,T), wte (Vs,C), wpe (maxT,C) or null
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int team = TeamSize(threads, rows, rows * C);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t bt = 0; bt < rows; ++bt) {
    const int t = static_cast<int>(bt % T);
    float* out_bt = out + bt * C;
    const int64_t row = ShardRow(inp[bt], vocab_start, Vs);
    const float* wte_ix = row < 0 ? nullptr : wte + row * C;
    const float* wpe_t = wpe == nullptr ? nullptr : wpe + static_cast<int64_t>(t) * C;
    if (wte_ix != nullptr && wpe_t != nullptr) {
      for (int c = 0; c < C; ++c) out_bt[c] = wte_ix[c] + wpe_t[c];
    } else if (wte_ix != nullptr || wpe_t != nullptr) {
      std::copy_n(wte_ix != nullptr ? wte_ix : wpe_t, C, out_bt);
    } else {
      // -0 rather than +0: adding it to any x (a -0 sum included) gives x,
      // so the group's sum of shard outputs is exact (backend.h).
      std::fill_n(out_bt, C, -0.0f);
    }
  }
}

void EncoderBackwardShard(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                          int vocab_start, int Vs, int B, int T, int C, int threads) {
  // dwpe (maxT,C) or null: each (t, c) sums over b in order.
  if (dwpe != nullptr) {
    const int team = TeamSize(threads, T, int64_t{B} * T * C);
#pragma omp parallel for num_threads(team) schedule(static)
    for (int t = 0; t < T; ++t) {
      float* dwpe_t = dwpe + static_cast<int64_t>(t) * C;
      for (int b = 0; b < B; ++b) {
        const float* dout_bt = dout + (static_cast<int64_t>(b) * T + t) * C;
        for (int c = 0; c < C; ++c) dwpe_t[c] += dout_bt[c];
      }
    }
  }
  // dwte (Vs,C): a token may repeat, so rows collide; split channels instead
  // and visit positions in order.
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int blocks = (C + kChannelBlock - 1) / kChannelBlock;
  const int team2 = TeamSize(threads, blocks, rows * C);
#pragma omp parallel for num_threads(team2) schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kChannelBlock;
    const int c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t bt = 0; bt < rows; ++bt) {
      const int64_t row = ShardRow(inp[bt], vocab_start, Vs);
      if (row < 0) continue;
      float* dwte_ix = dwte + row * C;
      const float* dout_bt = dout + bt * C;
      for (int c = c0; c < c1; ++c) dwte_ix[c] += dout_bt[c];
    }
  }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, int threads) {
  // out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C)
  const int team = TeamSize(threads, N, int64_t{N} * C);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    const float m = RowMean(StridedSum(x, C, 0, 1), C);
    const float s = LayerNormRstd(StridedSquaredDeviation(x, C, m, 0, 1), C);
    float* y = out + static_cast<int64_t>(n) * C;
    for (int c = 0; c < C; ++c) y[c] = LayerNormOutput(x[c], m, s, weight[c], bias[c]);
    mean[n] = m;
    rstd[n] = s;
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, int threads) {
  // dinp: rows are independent; the two row means are serial sums.
  const int team = TeamSize(threads, N, int64_t{N} * C);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* dy = dout + static_cast<int64_t>(n) * C;
    const float* x = inp + static_cast<int64_t>(n) * C;
    float* dx = dinp + static_cast<int64_t>(n) * C;
    const float m = mean[n];
    const float s = rstd[n];
    const LayerNormGradSums sums = StridedLayerNormGradSums(dy, x, weight, m, s, C, 0, 1);
    const float dnorm_mean = RowMean(sums.dnorm, C);
    const float dnorm_norm_mean = RowMean(sums.dnorm_norm, C);
    for (int c = 0; c < C; ++c) {
      dx[c] += LayerNormInputGrad(x[c], weight[c], dy[c], m, s, dnorm_mean, dnorm_norm_mean);
    }
  }
  // dweight, dbias: channel blocks, rows in order.
  const int blocks = (C + kChannelBlock - 1) / kChannelBlock;
  const int team2 = TeamSize(threads, blocks, int64_t{N} * C);
#pragma omp parallel for num_threads(team2) schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kChannelBlock;
    const int width = std::min(C, c0 + kChannelBlock) - c0;
    float acc_w[kChannelBlock] = {};
    float acc_b[kChannelBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* dy = dout + static_cast<int64_t>(n) * C + c0;
      const float* x = inp + static_cast<int64_t>(n) * C + c0;
      const float m = mean[n];
      const float s = rstd[n];
      for (int j = 0; j < width; ++j) {
        acc_w[j] += LayerNormWeightGradTerm(x[j], m, s, dy[j]);
        acc_b[j] += dy[j];
      }
    }
    for (int j = 0; j < width; ++j) {
      dweight[c0 + j] += acc_w[j];
      dbias[c0 + j] += acc_b[j];
    }
  }
}

void GeluForward(float* out, const float* inp, size_t n, int threads) {
  const int64_t count = static_cast<int64_t>(n);
  const int64_t blocks = (count + kPointwiseBlock - 1) / kPointwiseBlock;
  const int team = TeamSize(threads, blocks, count * 8);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t i0 = blk * kPointwiseBlock;
    GeluForwardSpan(out + i0, inp + i0, std::min(kPointwiseBlock, count - i0));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n, int threads) {
  const int64_t count = static_cast<int64_t>(n);
  const int64_t blocks = (count + kPointwiseBlock - 1) / kPointwiseBlock;
  const int team = TeamSize(threads, blocks, count * 8);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t i0 = blk * kPointwiseBlock;
    GeluBackwardSpan(dinp + i0, inp + i0, dout + i0, std::min(kPointwiseBlock, count - i0));
  }
}

void ResidualForward(float* out, const float* inp1, const float* inp2, size_t n, int threads) {
  const int64_t count = static_cast<int64_t>(n);
  const int team = TeamSize(threads, count, count);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = inp1[i] + inp2[i];
}

void ResidualBackward(float* dinp1, float* dinp2, const float* dout, size_t n, int threads) {
  const int64_t count = static_cast<int64_t>(n);
  const int team = TeamSize(threads, count, count);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

}  // namespace cohort::compute::cpu
