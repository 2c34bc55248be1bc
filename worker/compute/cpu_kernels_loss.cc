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

namespace cohort::compute::cpu {
namespace {

// A shard holds the logit columns of vocab ids [vocab_start, vocab_start +
// Vs); the first ValidColumns of them are real ids, the rest padding.
int ValidColumns(int V, int Vs, int vocab_start) { return std::clamp(V - vocab_start, 0, Vs); }

// The column of `target` in the shard, or -1 when another shard holds it.
int TargetColumn(int32_t target, int valid, int vocab_start) {
  const int64_t col = int64_t{target} - vocab_start;
  return col >= 0 && col < valid ? static_cast<int>(col) : -1;
}

// lse = max + log(sum) and loss = lse - target_logit, both in double, stored
// in fp32.
void StoreLoss(float max, double sum, float target_logit, float* loss, float* lse) {
  const double logsumexp = static_cast<double>(max) + std::log(sum);
  *lse = static_cast<float>(logsumexp);
  *loss = static_cast<float>(logsumexp - static_cast<double>(target_logit));
}

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
  const int valid = ValidColumns(V, Vs, vocab_start);
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
  const int valid = ValidColumns(V, Vs, vocab_start);
  const int team = TeamSize(threads, N, int64_t{N} * valid);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + static_cast<int64_t>(n) * Vs;
    // Accumulated in double (as CrossEntropyForward), rounded to fp32 for the
    // group's reduction.
    sums[n] = valid == 0 ? 0.0f : static_cast<float>(SumExpShifted(row, valid, row_max[n]));
    const int col = TargetColumn(targets[n], valid, vocab_start);
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
  const int valid = ValidColumns(V, Vs, vocab_start);
  const int team = TeamSize(threads, N, int64_t{N} * std::max(valid, 1));
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + static_cast<int64_t>(n) * Vs;
    float* drow = dlogits + static_cast<int64_t>(n) * Vs;
    const float s = lse[n];
    const float dloss = dlosses[n];
    ScaledExpShifted(drow, row, valid, s, dloss);
    const int col = TargetColumn(targets[n], valid, vocab_start);
    if (col >= 0) {
      float p_target;
      ScaledExpShifted(&p_target, row + col, 1, s, 1.0f);
      drow[col] = (p_target - 1.0f) * dloss;
    }
    std::fill(drow + valid, drow + Vs, 0.0f);
  }
}

}  // namespace cohort::compute::cpu
