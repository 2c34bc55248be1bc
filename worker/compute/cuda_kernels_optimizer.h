#pragma once
// Host-side launchers of the optimizer kernels (cuda_kernels_optimizer.cu):
// the step's end on device memory (backend.h, "The optimizer step on backend
// memory"). Plain C++17 over raw device pointers and a stream, like
// cuda_kernels.h; each only enqueues, and launch errors are the caller's to
// read (cudaGetLastError).
//
// Determinism: every sum has a fixed shape (gpu_launch_plan.h's kRowThreads
// threads per piece, one block for the pieces' total), no atomics.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "worker/compute/adamw_math.h"
#include "worker/compute/param_copy_layout.h"

namespace cohort::compute::cuda {

// sums[k] = sum of grads[i]^2 in double over [pieces[2k], pieces[2k+1]).
void SumOfSquaresPieces(double* sums, const float* grads, const int64_t* pieces, int64_t count,
                        cudaStream_t stream);
// scalars[0] = sqrt(sum of sums[0..count)), scalars[1] = ClipFactor(scalars[0], max_norm).
void FinishGradNorm(double* scalars, const double* sums, int64_t count, double max_norm,
                    cudaStream_t stream);
// sum[0] = the sum of losses[0..n) in double, one block's fixed tree.
void SumLosses(double* sum, const float* losses, int64_t n, cudaStream_t stream);
// scalars[0] = NaN when any of values[0..n) is not finite.
void SkipUpdateUnlessFinite(double* scalars, const double* values, int64_t n, cudaStream_t stream);

// The weights' bf16 working copy (backend.h, AttachParams) as the kernels
// see it: `copy` (bf16 bits) laid out by the `count` ParamCopyLayout
// `blocks` (device memory). A null copy: none.
struct ParamCopyRef {
  uint16_t* copy = nullptr;
  const ParamCopyBlock* blocks = nullptr;
  int count = 0;
};

// AdamWElement over [begin, end) with the gradient times float(scalars[1]);
// nothing when scalars[0] is not finite. m and v hold elements from
// moment_base. With a copy, each updated element that a block holds is
// also written there, rounded to bf16 (round to nearest even, as the GEMMs'
// per-call rounding), from the fp32 value just stored.
void ClipAdamW(float* params, float* m, float* v, const float* grads, const double* scalars,
               int64_t begin, int64_t end, int64_t moment_base, bool decay,
               const AdamWScalars& adamw, const ParamCopyRef& copy, cudaStream_t stream);
// copy[CopyIndexOf(i)] = bf16(params[i]) for every i < numel a block holds.
void RefreshParamCopy(const ParamCopyRef& copy, const float* params, int64_t numel,
                      cudaStream_t stream);

}  // namespace cohort::compute::cuda
