// Softmax + cross-entropy, whole and over a vocab shard (the CPU backend's
// contract: the sum of exponentials in double, lse and the loss formed in
// double, a shard's partial sum rounded to fp32 for the group's reduction).
// One block of kRowThreads threads per row; CUB's block reductions combine
// the threads' strided partials in a fixed tree. A thread's partials, the
// loss and the dlogit element are kernel_math.h's, which the CPU tests run.
// The logits and their gradient are activations, T (float or Bf16:
// cuda_kernels.h), widened as read; every sum and statistic is fp32 or double.

#include <math.h>

#include "worker/compute/cuda_kernels.h"
#include "worker/compute/cuda_reduce.cuh"
#include "worker/compute/kernel_math.h"

namespace cohort::compute::cuda {
namespace {

using gpu_plan::GridStrideBlocks;
using gpu_plan::kRowThreads;
using gpu_plan::kThreads;

using kernel_math::ShardDlogit;
using kernel_math::ShardTargetColumn;
using kernel_math::ShardValidColumns;
using kernel_math::Store;
using kernel_math::StoreLoss;
using kernel_math::StridedMax;
using kernel_math::StridedSumExp;
using kernel_math::Widen;

template <typename T>
__device__ inline float RowMax(const T* row, int valid, BlockShared<float>& shared) {
  return BlockReduceAll(StridedMax(row, valid, static_cast<int>(threadIdx.x), kRowThreads), MaxOp{},
                        shared);
}

template <typename T>
__device__ inline double RowSumExp(const T* row, int valid, float shift,
                                   BlockShared<double>& shared) {
  return BlockReduceAll(
      StridedSumExp(row, valid, shift, static_cast<int>(threadIdx.x), kRowThreads), SumOp{},
      shared);
}

template <typename T>
__global__ void CrossEntropyForwardKernel(float* losses, float* lse, const T* logits,
                                          const int32_t* targets, int V, int Vp) {
  __shared__ BlockShared<float> shared_max;
  __shared__ BlockShared<double> shared_sum;
  const int64_t n = blockIdx.x;
  const T* row = logits + n * Vp;
  const float maxval = RowMax(row, V, shared_max);
  const double sum = RowSumExp(row, V, maxval, shared_sum);
  if (threadIdx.x == 0) StoreLoss(maxval, sum, Widen(row[targets[n]]), &losses[n], &lse[n]);
}

template <typename T>
__global__ void ShardMaxKernel(float* row_max, const T* logits, int valid, int Vs) {
  __shared__ BlockShared<float> shared;
  const int64_t n = blockIdx.x;
  const float m = RowMax(logits + n * Vs, valid, shared);
  if (threadIdx.x == 0) row_max[n] = m;
}

template <typename T>
__global__ void ShardSumsKernel(float* sums, const T* logits, const float* row_max,
                                const int32_t* targets, int N, int valid, int Vs, int vocab_start) {
  __shared__ BlockShared<double> shared;
  const int64_t n = blockIdx.x;
  const T* row = logits + n * Vs;
  const double sum = RowSumExp(row, valid, row_max[n], shared);
  if (threadIdx.x == 0) {
    sums[n] = valid == 0 ? 0.0f : static_cast<float>(sum);
    const int col = ShardTargetColumn(targets[n], valid, vocab_start);
    sums[N + n] = col < 0 ? 0.0f : Widen(row[col]);
  }
}

__global__ void ShardFinishKernel(float* losses, float* lse, const float* row_max,
                                  const float* sums, int N) {
  for (int64_t n = GlobalThread(); n < N; n += GridThreads()) {
    StoreLoss(row_max[n], sums[n], sums[N + n], &losses[n], &lse[n]);
  }
}

template <typename T>
__global__ void ShardBackwardKernel(T* dlogits, const T* logits, const float* lse,
                                    const int32_t* targets, const float* dlosses, int valid, int Vs,
                                    int vocab_start) {
  const int64_t n = blockIdx.x;
  const T* row = logits + n * Vs;
  T* drow = dlogits + n * Vs;
  const float s = lse[n];
  const float dloss = dlosses[n];
  const int target_col = ShardTargetColumn(targets[n], valid, vocab_start);
  // Safe in place (dlogits == logits): element j is read only by the thread
  // that writes it, before it writes it; lse, targets and dlosses are other
  // buffers, read before the loop.
  for (int j = threadIdx.x; j < Vs; j += kRowThreads) {
    Store(&drow[j], ShardDlogit(row, j, valid, target_col, s, dloss));
  }
}

__global__ void FillKernel(float* out, float value, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) out[i] = value;
}

}  // namespace

template <typename T>
void CrossEntropyForward(float* losses, float* lse, const T* logits, const int32_t* targets, int N,
                         int V, int Vp, cudaStream_t stream) {
  if (N <= 0) return;
  CrossEntropyForwardKernel<<<N, kRowThreads, 0, stream>>>(losses, lse, logits, targets, V, Vp);
}

template <typename T>
void CrossEntropyShardMax(float* row_max, const T* logits, int N, int V, int Vs, int vocab_start,
                          cudaStream_t stream) {
  if (N <= 0) return;
  const int valid = ShardValidColumns(V, Vs, vocab_start);
  if (valid == 0) {
    FillKernel<<<GridStrideBlocks(N, kThreads), kThreads, 0, stream>>>(row_max, -INFINITY, N);
    return;
  }
  ShardMaxKernel<<<N, kRowThreads, 0, stream>>>(row_max, logits, valid, Vs);
}

template <typename T>
void CrossEntropyShardSums(float* sums, const T* logits, const float* row_max,
                           const int32_t* targets, int N, int V, int Vs, int vocab_start,
                           cudaStream_t stream) {
  if (N <= 0) return;
  ShardSumsKernel<<<N, kRowThreads, 0, stream>>>(
      sums, logits, row_max, targets, N, ShardValidColumns(V, Vs, vocab_start), Vs, vocab_start);
}

void CrossEntropyShardFinish(float* losses, float* lse, const float* row_max, const float* sums,
                             int N, cudaStream_t stream) {
  if (N <= 0) return;
  ShardFinishKernel<<<GridStrideBlocks(N, kThreads), kThreads, 0, stream>>>(losses, lse, row_max,
                                                                            sums, N);
}

template <typename T>
void CrossEntropyShardBackward(T* dlogits, const T* logits, const float* lse,
                               const int32_t* targets, const float* dlosses, int N, int V, int Vs,
                               int vocab_start, cudaStream_t stream) {
  if (N <= 0) return;
  ShardBackwardKernel<<<N, kRowThreads, 0, stream>>>(dlogits, logits, lse, targets, dlosses,
                                                     ShardValidColumns(V, Vs, vocab_start), Vs,
                                                     vocab_start);
}

#define COHORT_INSTANTIATE_LOSS(T)                                                                 \
  template void CrossEntropyForward<T>(float*, float*, const T*, const int32_t*, int, int, int,    \
                                       cudaStream_t);                                              \
  template void CrossEntropyShardMax<T>(float*, const T*, int, int, int, int, cudaStream_t);       \
  template void CrossEntropyShardSums<T>(float*, const T*, const float*, const int32_t*, int, int, \
                                         int, int, cudaStream_t);                                  \
  template void CrossEntropyShardBackward<T>(T*, const T*, const float*, const int32_t*,           \
                                             const float*, int, int, int, int, cudaStream_t);
COHORT_FOR_EACH_STORAGE(COHORT_INSTANTIATE_LOSS)
#undef COHORT_INSTANTIATE_LOSS

}  // namespace cohort::compute::cuda
