// Fused softmax + cross-entropy over the first V of Vp logit columns.
// Rows are independent (OpenMP over rows); each row's max and sum of
// exponentials are serial. The sum is kept in double: it costs nothing next
// to the exponentials and keeps the loss accurate for large vocabularies.

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
    float maxval = row[0];
    for (int i = 1; i < V; ++i) maxval = std::max(maxval, row[i]);
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i] - maxval));
    const double logsumexp = static_cast<double>(maxval) + std::log(sum);
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
    for (int i = 0; i < V; ++i) {
      const float p = std::exp(row[i] - s);
      drow[i] = (p - (i == target ? 1.0f : 0.0f)) * dloss;
    }
    for (int i = V; i < Vp; ++i) drow[i] = 0.0f;
  }
}

}  // namespace cohort::compute::cpu
