#include "worker/train/grad_norm.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "worker/compute/adamw_math.h"

namespace cohort::train {
namespace {

int Threads(int threads) { return threads > 0 ? threads : omp_get_max_threads(); }

}  // namespace

double SumOfSquares(const float* x, size_t n, int threads) {
  const int64_t chunks = static_cast<int64_t>((n + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk);
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for num_threads(Threads(threads)) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kSumOfSquaresChunk;
    const size_t end = std::min(n, begin + kSumOfSquaresChunk);
    double sum = 0.0;
    for (size_t i = begin; i < end; ++i) {
      const double v = x[i];
      sum += v * v;
    }
    partial[c] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

double ClipScale(double norm, double max_norm) { return compute::ClipFactor(norm, max_norm); }

void ScaleInPlace(float* x, size_t n, float scale, int threads) {
  if (scale == 1.0f) return;
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for num_threads(Threads(threads)) schedule(static)
  for (int64_t i = 0; i < count; ++i) x[i] *= scale;
}

void AddInPlace(float* dst, const float* src, size_t n, int threads) {
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for num_threads(Threads(threads)) schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] += src[i];
}

}  // namespace cohort::train
