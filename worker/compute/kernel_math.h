#pragma once
// The per-element and per-row math of the compute kernels, written once for
// the CUDA kernels (cuda_kernels_*.cu, where nvcc compiles it for the device)
// and for the host (the CPU kernels, and the unit tests that run it on the CPU
// against the CPU backend: tests/unit/compute/kernel_math_test.cc and
// kernel_math_softmax_test.cc). Plain C++17 with no CUDA header, so that g++
// compiles it as it is.
//
// What the host can and cannot tell about the device from these functions:
// - The arithmetic is the same operations in the same order on both sides,
//   but nvcc contracts a multiply and a dependent add into one fused
//   multiply-add (its default -fmad=true, which the build keeps:
//   cmake/CohortCuda.cmake), and g++ does not (-ffp-contract=off,
//   CMakeLists.txt). Where a formula multiplies and adds (the LayerNorm
//   output, the sums of products, GELU's cubic), the device rounds once where
//   the host rounds twice, so the two can differ in the last bits there.
// - The functions that call expf, sqrtf or log use the C library's on the
//   host and CUDA's on the device (expf within 2 ulp of exp; sqrtf and the
//   divisions correctly rounded, nvcc's -prec-sqrt and -prec-div defaults).
//   The CPU backend has an exponential of its own (cpu_kernels_vector.cc), so
//   the functions it shares that need one take it as an argument
//   (GeluFromExp, GeluGradFromExp, CrossEntropyDlogit).
// - A reduction across threads (CUB's warp and block reductions,
//   cuda_reduce.cuh) is not here: the Strided* functions give one lane's
//   share of a row (columns first, first + stride, ...), which the device
//   combines across lanes and the CPU computes whole (first 0, stride 1).
// - The row functions take their activations in either storage, float or
//   bf16 (bf16_math.h's Bf16: backend.h, "Activation storage"): they widen
//   each element as they read it and compute in fp32, and the one that
//   writes (StridedResidualSum) rounds what it stores, once.

#include <cmath>
#include <cstdint>

#include "worker/compute/bf16_math.h"
#include "worker/compute/host_device.h"

namespace cohort::compute::kernel_math {

// std::isinf is not a device function; CUDA's isinf is not a host one.
COHORT_HOST_DEVICE bool IsInf(float v) {
#if defined(__CUDA_ARCH__)
  return isinf(v);
#else
  return std::isinf(v);
#endif
}

// ---- GELU, tanh approximation -------------------------------------------------
// Through the logistic function: 0.5 (1 + tanh(u)) = sigmoid(2u) and
// 0.5 sech^2(u) = 2 s (1 - s), which needs one exponential and keeps full
// relative accuracy where 1 + tanh(u) or 1 - tanh(u) would cancel:
//   u = kGeluScale (x + kGeluCubic x^3),  e = exp(-2u)
//   s = 1 / (1 + e),  1 - s = e s  (e = inf: s = 0, 1 - s = 1)
//   gelu(x) = x s,  gelu'(x) = s + x 2 s (1 - s) kGeluScale (1 + 3 kGeluCubic x^2)
// The caller takes the exponential (CUDA's expf on the device, the CPU
// backend's own on the CPU). For finite x: gelu(x) = x for x >= 10 and -0 for
// x below about -10.05, where e overflows. The derivative is NaN for
// |x| > ~1.8e19, where x^2 overflows and meets a zero (1 - s, or s):
// activations are many orders of magnitude below that.

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluCubic = 0.044715f;

// -2u, the argument of GELU's exponential.
COHORT_HOST_DEVICE float GeluExpArgument(float x) {
  return -2.0f * (kGeluScale * (x + kGeluCubic * x * x * x));
}

// gelu(x), given e = exp(GeluExpArgument(x)).
COHORT_HOST_DEVICE float GeluFromExp(float x, float e) { return x * (1.0f / (1.0f + e)); }

// gelu'(x), given e = exp(GeluExpArgument(x)).
COHORT_HOST_DEVICE float GeluGradFromExp(float x, float e) {
  const float s = 1.0f / (1.0f + e);
  const float one_minus_s = IsInf(e) ? 1.0f : e * s;
  return s + x * (2.0f * s * one_minus_s) * (kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x));
}

// ---- Row sums ------------------------------------------------------------------
// Each sums the columns c = first, first + stride, ... below n in that order:
// a whole row (first 0, stride 1: the CPU kernels) or one lane's share of it
// (first = lane, stride = lanes: the device's warp and block kernels).

COHORT_HOST_DEVICE float RowMean(float sum, int n) { return sum / n; }

template <typename T>
COHORT_HOST_DEVICE float StridedSum(const T* x, int n, int first, int stride) {
  float sum = 0.0f;
  for (int c = first; c < n; c += stride) sum += Widen(x[c]);
  return sum;
}

// out[c] = a[c] + b[c] over the share's columns, returning the sum of those
// out[c] in StridedSum's order: a residual add and the first pass of the
// LayerNorm that normalises it, in one (the fused residual + LayerNorm). The
// same additions as ResidualForward then StridedSum(out, ...), so the same
// bits. out may be neither input. In bf16 the sum is of the rounded values
// stored, which is what the LayerNorm reading `out` back normalises.
template <typename T>
COHORT_HOST_DEVICE float StridedResidualSum(T* out, const T* a, const T* b, int n, int first,
                                            int stride) {
  float sum = 0.0f;
  for (int c = first; c < n; c += stride) {
    const T r = Narrow<T>(Widen(a[c]) + Widen(b[c]));
    out[c] = r;
    sum += Widen(r);
  }
  return sum;
}

// sum_c a[c] b[c].
COHORT_HOST_DEVICE float StridedDot(const float* a, const float* b, int n, int first, int stride) {
  float dot = 0.0f;
  for (int c = first; c < n; c += stride) dot += a[c] * b[c];
  return dot;
}

// max_c x[c], -infinity where the share is empty (fmaxf: a NaN loses to a
// number).
template <typename T>
COHORT_HOST_DEVICE float StridedMax(const T* x, int n, int first, int stride) {
  float m = -INFINITY;
  for (int c = first; c < n; c += stride) m = fmaxf(m, Widen(x[c]));
  return m;
}

// ---- LayerNorm over a row of C channels (eps 1e-5) -----------------------------
// Two passes, mean then the squared deviations from it: no cancellation.
// Forward: mean = RowMean(StridedSum), rstd = LayerNormRstd(StridedSquaredDeviation),
// then LayerNormOutput per element. Backward: the row means of StridedLayerNormGradSums,
// then LayerNormInputGrad per element; LayerNormWeightGradTerm is the term the
// weight's gradient sums over rows.

inline constexpr float kLayerNormEps = 1e-5f;

// sum_c (x[c] - mean)^2.
template <typename T>
COHORT_HOST_DEVICE float StridedSquaredDeviation(const T* x, int C, float mean, int first,
                                                 int stride) {
  float sum = 0.0f;
  for (int c = first; c < C; c += stride) {
    const float d = Widen(x[c]) - mean;
    sum += d * d;
  }
  return sum;
}

// 1 / sqrt(variance + eps), from the row's sum of squared deviations.
COHORT_HOST_DEVICE float LayerNormRstd(float squared_deviation_sum, int C) {
  return 1.0f / sqrtf(squared_deviation_sum / C + kLayerNormEps);
}

COHORT_HOST_DEVICE float LayerNormNormalized(float x, float mean, float rstd) {
  return (x - mean) * rstd;
}

COHORT_HOST_DEVICE float LayerNormOutput(float x, float mean, float rstd, float weight,
                                         float bias) {
  return LayerNormNormalized(x, mean, rstd) * weight + bias;
}

// The backward's two row sums: of dnorm = weight * dy, and of dnorm * norm.
struct LayerNormGradSums {
  float dnorm = 0.0f;
  float dnorm_norm = 0.0f;
};

// dy and x are activations (float or Bf16); weight is fp32.
template <typename T>
COHORT_HOST_DEVICE LayerNormGradSums StridedLayerNormGradSums(const T* dy, const T* x,
                                                              const float* weight, float mean,
                                                              float rstd, int C, int first,
                                                              int stride) {
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int c = first; c < C; c += stride) {
    const float norm = LayerNormNormalized(Widen(x[c]), mean, rstd);
    const float dnorm = weight[c] * Widen(dy[c]);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  return LayerNormGradSums{dnorm_sum, dnorm_norm_sum};
}

// d loss / d x for one element, given the row means of the two sums above.
COHORT_HOST_DEVICE float LayerNormInputGrad(float x, float weight, float dy, float mean, float rstd,
                                            float dnorm_mean, float dnorm_norm_mean) {
  const float norm = LayerNormNormalized(x, mean, rstd);
  const float dnorm = weight * dy;
  return (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd;
}

COHORT_HOST_DEVICE float LayerNormWeightGradTerm(float x, float mean, float rstd, float dy) {
  return LayerNormNormalized(x, mean, rstd) * dy;
}

// ---- Softmax + cross-entropy over a row of logits, whole or a vocab shard -------
// A shard holds the logit columns of vocab ids [vocab_start, vocab_start + Vs);
// the first ShardValidColumns of them are real ids, the rest padding (ids >= V),
// which take no part and get a zero gradient. The whole row is the shard with
// vocab_start 0 and Vs = Vp.

COHORT_HOST_DEVICE int ShardValidColumns(int V, int Vs, int vocab_start) {
  const int valid = V - vocab_start;
  return valid < 0 ? 0 : (valid > Vs ? Vs : valid);
}

// The column of `target` in the shard, or -1 when another shard holds it.
COHORT_HOST_DEVICE int ShardTargetColumn(int32_t target, int valid, int vocab_start) {
  const int64_t col = static_cast<int64_t>(target) - vocab_start;
  return col >= 0 && col < valid ? static_cast<int>(col) : -1;
}

// sum_c exp(x[c] - shift) with expf, each term fp32, the sum in double: the
// device's share of a row (the CPU backend sums its own exponential,
// SumExpShifted in cpu_kernels.h).
template <typename T>
COHORT_HOST_DEVICE double StridedSumExp(const T* x, int n, float shift, int first, int stride) {
  double sum = 0.0;
  for (int c = first; c < n; c += stride) sum += expf(Widen(x[c]) - shift);
  return sum;
}

// lse = max + log(sum) and loss = lse - target_logit, both in double, stored
// in fp32.
COHORT_HOST_DEVICE void StoreLoss(float max, double sum, float target_logit, float* loss,
                                  float* lse) {
  const double logsumexp = static_cast<double>(max) + log(sum);
  *lse = static_cast<float>(logsumexp);
  *loss = static_cast<float>(logsumexp - static_cast<double>(target_logit));
}

// (softmax - onehot) * dloss for a valid column whose probability is p.
COHORT_HOST_DEVICE float CrossEntropyDlogit(float p, bool is_target, float dloss) {
  return (is_target ? p - 1.0f : p) * dloss;
}

// dlogits[j] of a shard row, with p = expf(row[j] - lse); 0 in the padding.
// target_col is ShardTargetColumn's.
template <typename T>
COHORT_HOST_DEVICE float ShardDlogit(const T* row, int j, int valid, int target_col, float lse,
                                     float dloss) {
  if (j >= valid) return 0.0f;
  return CrossEntropyDlogit(expf(Widen(row[j]) - lse), j == target_col, dloss);
}

// ---- Causal attention's softmax --------------------------------------------------

// Columns 0 .. CausalColumns - 1 of a row of scores are unmasked; row r of
// (.., T, T) scores is query position r % T.
COHORT_HOST_DEVICE int CausalColumns(int64_t row, int T) { return static_cast<int>(row % T) + 1; }

// x[c] = exp(x[c] - shift) with expf, in place; returns their fp32 sum.
COHORT_HOST_DEVICE float StridedExpShiftedSum(float* x, int n, float shift, int first, int stride) {
  float sum = 0.0f;
  for (int c = first; c < n; c += stride) {
    const float e = expf(x[c] - shift);
    x[c] = e;
    sum += e;
  }
  return sum;
}

// The softmax's input gradient for one column: p (dp - sum_j p_j dp_j).
COHORT_HOST_DEVICE float SoftmaxInputGrad(float p, float dp, float dot) { return p * (dp - dot); }

// ---- Index maps ------------------------------------------------------------------

// Index i of a head-major (B,NH,T,hs) array -> the index of the same element
// in a token-major (B,T,parts,NH,hs) array, part 0 (parts = 3 for qkv, where
// part p is p * NH * hs further on; 1 for the (B,T,NH,hs) activations).
COHORT_HOST_DEVICE int64_t TokenMajorIndex(int64_t i, int T, int NH, int hs, int parts) {
  const int d = static_cast<int>(i % hs);
  const int64_t rest = i / hs;
  const int t = static_cast<int>(rest % T);
  const int64_t bh = rest / T;
  const int h = static_cast<int>(bh % NH);
  const int64_t b = bh / NH;
  const int64_t C = static_cast<int64_t>(NH) * hs;
  return (b * T + t) * parts * C + static_cast<int64_t>(h) * hs + d;
}

// The row of `token` in a shard holding rows [vocab_start, vocab_start + Vs)
// of the embedding, or -1 when the token lies outside the shard.
COHORT_HOST_DEVICE int64_t ShardRow(int32_t token, int vocab_start, int Vs) {
  const int64_t row = static_cast<int64_t>(token) - vocab_start;
  return row >= 0 && row < Vs ? row : -1;
}

// The key by which the device's embedding backward sorts positions: the
// token's shard row, or Vs (after every row, skipped) outside the shard.
COHORT_HOST_DEVICE uint32_t ShardSortKey(int32_t token, int vocab_start, int Vs) {
  const int64_t row = ShardRow(token, vocab_start, Vs);
  return row < 0 ? static_cast<uint32_t>(Vs) : static_cast<uint32_t>(row);
}

}  // namespace cohort::compute::kernel_math
