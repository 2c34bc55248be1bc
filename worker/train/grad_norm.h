#pragma once
// Gradient-norm clipping over flat ranges of the gradient arena, as
// torch.nn.utils.clip_grad_norm_ (L2 norm): the caller sums squares over the
// ranges it owns (unique parameters only: under tensor parallelism a
// replicated tensor counts once), reduces the sums across ranks if needed,
// takes the square root and scales every gradient by
//
//   ClipScale(norm, max_norm) = min(1, max_norm / (norm + 1e-6)).
//
// SumOfSquares is deterministic: the range is cut into fixed chunks of
// kSumOfSquaresChunk elements, each summed serially in double, and the chunk
// sums are added in order, so the bits do not depend on the thread count.
//
// Thread-safety: reentrant.

#include <cstddef>

namespace cohort::train {

inline constexpr size_t kSumOfSquaresChunk = 1 << 14;

// Sum of x[i]^2 for i < n, in double. threads: OpenMP threads, 0 = all cores.
double SumOfSquares(const float* x, size_t n, int threads);

// min(1, max_norm / (norm + 1e-6)); 1 (no clipping) when max_norm <= 0, and
// 1 for a NaN norm: the trainer checks the norm for finiteness itself.
double ClipScale(double norm, double max_norm);

// x[i] *= scale for i < n (a no-op for scale == 1).
void ScaleInPlace(float* x, size_t n, float scale, int threads);

// dst[i] += src[i] for i < n (gradient accumulation; element-wise, so the
// bits do not depend on the thread count).
void AddInPlace(float* dst, const float* src, size_t n, int threads);

}  // namespace cohort::train
