// Fused softmax + cross-entropy over the first V of Vp logit columns, and its
// vocab-parallel form over a shard of the columns. Rows are independent
// (OpenMP over rows); each row's max and sum of exponentials run inside one
// thread (vectorised, in a fixed lane order: cpu_kernels_vector.cc). The sum
// is kept in double: it costs little and keeps the loss accurate for large
// vocabularies. A vocab shard rounds its partial sum to fp32, the dtype the
// tensor group reduces.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "worker/compute/cpu_kernels.h"
#include "worker/compute/kernel_math.h"

namespace cohort::compute::cpu {
namespace {

// The row pieces and the shard's column rules are the CUDA kernels' too
// (kernel_math.h); the max and the sums of exponentials are this backend's
// vector primitives (cpu_kernels_vector.cc), with its own exponential.
using kernel_math::CrossEntropyDlogit;
using kernel_math::ShardTargetColumn;
using kernel_math::ShardValidColumns;
using kernel_math::StoreLoss;

}  // namespace

void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int N, int V, int Vp, int threads) {
  // losses (N), lse (N), logits (N,Vp), targets (N)
  const int team = TeamSize(threads, N, int64_t{N} * V);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + static_cast<int64_t>(n) * Vp;
    const float maxval = MaxOf(row, V);
    StoreLoss(maxval, SumExpShifted(row, V, maxval), row[targets[n]], &losses[n], &lse[n]);
  }
}

// ---- Vocab-parallel cross-entropy -------------------------------------------

void CrossEntropyShardMax(float* row_max, const float* logits, int N, int V, int Vs,
                          int vocab_start, int threads) {
  // row_max (N), logits (N,Vs)
  const int valid = ShardValidColumns(V, Vs, vocab_start);
  if (valid == 0) {
    std::fill_n(row_max, N, -HUGE_VALF);
    return;
  }
  const int team = TeamSize(threads, N, int64_t{N} * valid);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) row_max[n] = MaxOf(logits + static_cast<int64_t>(n) * Vs, valid);
}

void CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                           const int32_t* targets, int N, int V, int Vs, int vocab_start,
                           int threads) {
  // sums (2N): [sum of exp(logit - max) | target logit or 0], logits (N,Vs)
  const int valid = ShardValidColumns(V, Vs, vocab_start);
  const int team = TeamSize(threads, N, int64_t{N} * valid);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + static_cast<int64_t>(n) * Vs;
    // Accumulated in double (as CrossEntropyForward), rounded to fp32 for the
    // group's reduction.
    sums[n] = valid == 0 ? 0.0f : static_cast<float>(SumExpShifted(row, valid, row_max[n]));
    const int col = ShardTargetColumn(targets[n], valid, vocab_start);
    sums[N + n] = col < 0 ? 0.0f : row[col];
  }
}

void CrossEntropyShardFinish(float* losses, float* lse, const float* row_max, const float* sums,
                             int N, int threads) {
  const int team = TeamSize(threads, N, N);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) StoreLoss(row_max[n], sums[n], sums[N + n], &losses[n], &lse[n]);
}

void CrossEntropyShardBackward(float* dlogits, const float* logits, const float* lse,
                               const int32_t* targets, const float* dlosses, int N, int V, int Vs,
                               int vocab_start, int threads) {
  // dlogits (N,Vs) = (softmax - onehot) * dlosses on valid columns, zero in
  // the padding.
  const int valid = ShardValidColumns(V, Vs, vocab_start);
  const int team = TeamSize(threads, N, int64_t{N} * std::max(valid, 1));
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + static_cast<int64_t>(n) * Vs;
    float* drow = dlogits + static_cast<int64_t>(n) * Vs;
    const float s = lse[n];
    const float dloss = dlosses[n];
    // CrossEntropyDlogit(p, false, dloss) = p * dloss for every valid column
    // at once, vectorised; then the target's column. The target's
    // probability is taken first, so that drow may be row itself (in place:
    // every other column reads its own logit before writing it).
    const int col = ShardTargetColumn(targets[n], valid, vocab_start);
    float p_target = 0.0f;
    if (col >= 0) ScaledExpShifted(&p_target, row + col, 1, s, 1.0f);
    ScaledExpShifted(drow, row, valid, s, dloss);
    if (col >= 0) drow[col] = CrossEntropyDlogit(p_target, true, dloss);
    std::fill(drow + valid, drow + Vs, 0.0f);
  }
}

}  // namespace cohort::compute::cpu
