// The optimizer kernels: the gradient norm's squares per piece, the norm and
// clip factor, and AdamW with the clip fused in (cuda_kernels_optimizer.h).
// Every sum is a fixed tree (CUB's block reduction over a fixed width, over
// partials each thread adds in a fixed stride), so a step's bits repeat run
// to run; they differ from the CPU's serial sums, which is the backends'
// contract (backend.h, Determinism).

#include <cuda_bf16.h>

#include <cmath>

#include "worker/compute/cuda_kernels_optimizer.h"
#include "worker/compute/cuda_reduce.cuh"

namespace cohort::compute::cuda {
namespace {

using gpu_plan::GridStrideBlocks;
using gpu_plan::kMaxBlocks;
using gpu_plan::kRowThreads;
using gpu_plan::kThreads;

// One block per piece (grid-stride over pieces): thread t adds elements
// begin + t, begin + t + kRowThreads, ... in double, then the block's tree.
__global__ void SumOfSquaresPiecesKernel(double* sums, const float* grads, const int64_t* pieces,
                                         int64_t count) {
  __shared__ BlockShared<double> shared;
  for (int64_t k = blockIdx.x; k < count; k += gridDim.x) {
    const int64_t begin = pieces[2 * k];
    const int64_t end = pieces[2 * k + 1];
    double sum = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += kRowThreads) {
      const double value = grads[i];
      sum += value * value;
    }
    const double total = BlockReduceAll(sum, SumOp{}, shared);
    if (threadIdx.x == 0) sums[k] = total;
  }
}

// One block: thread t adds sums t, t + kRowThreads, ... in order, then the
// block's tree; thread 0 writes the norm and the clip factor.
__global__ void FinishGradNormKernel(double* scalars, const double* sums, int64_t count,
                                     double max_norm) {
  __shared__ BlockShared<double> shared;
  double sum = 0.0;
  for (int64_t k = threadIdx.x; k < count; k += kRowThreads) sum += sums[k];
  const double total = BlockReduceAll(sum, SumOp{}, shared);
  if (threadIdx.x == 0) {
    const double norm = sqrt(total);
    scalars[0] = norm;
    scalars[1] = ClipFactor(norm, max_norm);
  }
}

// One block: thread t adds losses t, t + kRowThreads, ... in double, then
// the block's tree.
__global__ void SumLossesKernel(double* sum, const float* losses, int64_t n) {
  __shared__ BlockShared<double> shared;
  double partial = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kRowThreads) partial += losses[i];
  const double total = BlockReduceAll(partial, SumOp{}, shared);
  if (threadIdx.x == 0) sum[0] = total;
}

// One thread: the step's loss sums are a handful.
__global__ void SkipUpdateUnlessFiniteKernel(double* scalars, const double* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!isfinite(values[i])) scalars[0] = nan("");
  }
}

// Element i's copy, if a block holds it: the rounding RoundToBf16Kernel
// (the GEMMs' per-call rounding) applies, so the bits are the same.
__device__ inline void WriteCopy(const ParamCopyRef& copy, int64_t i, float value) {
  const int64_t at = CopyIndexOf(copy.blocks, copy.count, i);
  if (at >= 0) reinterpret_cast<__nv_bfloat16*>(copy.copy)[at] = __float2bfloat16_rn(value);
}

__global__ void ClipAdamWKernel(float* params, float* m, float* v, const float* grads,
                                const double* scalars, int64_t begin, int64_t end,
                                int64_t moment_base, bool decay, AdamWScalars adamw,
                                ParamCopyRef copy) {
  const double norm = scalars[0];
  if (!isfinite(norm)) return;
  const float clip = static_cast<float>(scalars[1]);
  for (int64_t i = begin + GlobalThread(); i < end; i += GridThreads()) {
    const int64_t j = i - moment_base;
    AdamWElement(adamw, decay, grads[i] * clip, &params[i], &m[j], &v[j]);
    if (copy.copy != nullptr) WriteCopy(copy, i, params[i]);
  }
}

__global__ void RefreshParamCopyKernel(ParamCopyRef copy, const float* params, int64_t numel) {
  for (int64_t i = GlobalThread(); i < numel; i += GridThreads()) WriteCopy(copy, i, params[i]);
}

}  // namespace

void SumOfSquaresPieces(double* sums, const float* grads, const int64_t* pieces, int64_t count,
                        cudaStream_t stream) {
  if (count <= 0) return;
  const int64_t blocks = count < kMaxBlocks ? count : kMaxBlocks;
  SumOfSquaresPiecesKernel<<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(
      sums, grads, pieces, count);
}

void FinishGradNorm(double* scalars, const double* sums, int64_t count, double max_norm,
                    cudaStream_t stream) {
  FinishGradNormKernel<<<1, kRowThreads, 0, stream>>>(scalars, sums, count, max_norm);
}

void ClipAdamW(float* params, float* m, float* v, const float* grads, const double* scalars,
               int64_t begin, int64_t end, int64_t moment_base, bool decay,
               const AdamWScalars& adamw, const ParamCopyRef& copy, cudaStream_t stream) {
  if (end <= begin) return;
  const int64_t blocks = GridStrideBlocks(end - begin, kThreads);
  ClipAdamWKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      params, m, v, grads, scalars, begin, end, moment_base, decay, adamw, copy);
}

void SumLosses(double* sum, const float* losses, int64_t n, cudaStream_t stream) {
  SumLossesKernel<<<1, kRowThreads, 0, stream>>>(sum, losses, n);
}

void SkipUpdateUnlessFinite(double* scalars, const double* values, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  SkipUpdateUnlessFiniteKernel<<<1, 1, 0, stream>>>(scalars, values, n);
}

void RefreshParamCopy(const ParamCopyRef& copy, const float* params, int64_t numel,
                      cudaStream_t stream) {
  if (numel <= 0 || copy.copy == nullptr) return;
  RefreshParamCopyKernel<<<static_cast<unsigned>(GridStrideBlocks(numel, kThreads)), kThreads, 0,
                           stream>>>(copy, params, numel);
}

}  // namespace cohort::compute::cuda
