// Fused softmax + cross-entropy over the first V of Vp logit columns.
// Rows are independent (OpenMP over rows); each row's max and sum of
// exponentials run inside one thread (vectorised, in a fixed lane order:
// cpu_kernels_vector.cc). The sum is kept in double: it costs little and
// keeps the loss accurate for large vocabularies.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "worker/compute/cpu_kernels.h"

namespace cohort::compute::cpu {

void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int N, int V, int Vp, int threads) {
  // losses (N), lse (N), logits (N,Vp), targets (N)
  const int team = TeamSize(threads, N, int64_t{N} * V);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + static_cast<int64_t>(n) * Vp;
    const float maxval = MaxOf(row, V);
    const double logsumexp = static_cast<double>(maxval) + std::log(SumExpShifted(row, V, maxval));
    lse[n] = static_cast<float>(logsumexp);
    losses[n] = static_cast<float>(logsumexp - static_cast<double>(row[targets[n]]));
  }
}

void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                          const int32_t* targets, const float* dlosses, int N, int V, int Vp,
                          int threads) {
  // dlogits (N,Vp) = (softmax - onehot) * dlosses, zero in the padding.
  const int team = TeamSize(threads, N, int64_t{N} * V);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + static_cast<int64_t>(n) * Vp;
    float* drow = dlogits + static_cast<int64_t>(n) * Vp;
    const float s = lse[n];
    const float dloss = dlosses[n];
    const int target = targets[n];
    ScaledExpShifted(drow, row, V, s, dloss);
    float p_target;
    ScaledExpShifted(&p_target, row + target, 1, s, 1.0f);
    drow[target] = (p_target - 1.0f) * dloss;
    std::fill(drow + V, drow + Vp, 0.0f);
  }
}

}  // namespace cohort::compute::cpu
