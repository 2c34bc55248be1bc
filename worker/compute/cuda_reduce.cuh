#pragma once
// Device-side reductions shared by the CUDA kernels: CUB's warp and block
// primitives, with the result handed to every thread (CUB leaves it in
// thread 0 only). CUB's reductions have a fixed tree for a given width, so
// a row reduced this way sums in the same order on every run.

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "worker/compute/gpu_launch_plan.h"

namespace cohort::compute::cuda {

struct MaxOp {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

using WarpReduceFloat = cub::WarpReduce<float>;

// Every lane of a full warp gets the warp's sum (max) of `value`. `temp` is
// this warp's own storage.
__device__ inline float WarpSumAll(float value, WarpReduceFloat::TempStorage& temp) {
  const float total = WarpReduceFloat(temp).Sum(value);
  __syncwarp();
  return __shfl_sync(0xffffffffu, total, 0);
}
__device__ inline float WarpMaxAll(float value, WarpReduceFloat::TempStorage& temp) {
  const float total = WarpReduceFloat(temp).Reduce(value, MaxOp{});
  __syncwarp();
  return __shfl_sync(0xffffffffu, total, 0);
}

// Block-wide reductions for blocks of gpu_plan::kRowThreads threads; every
// thread gets the result. Each call synchronises the block twice, so it
// must be reached by all threads.
template <typename T>
struct BlockShared {
  typename cub::BlockReduce<T, gpu_plan::kRowThreads>::TempStorage temp;
  T result;
};

template <typename T, typename Op>
__device__ inline T BlockReduceAll(T value, Op op, BlockShared<T>& shared) {
  const T total = cub::BlockReduce<T, gpu_plan::kRowThreads>(shared.temp).Reduce(value, op);
  if (threadIdx.x == 0) shared.result = total;
  __syncthreads();
  const T all = shared.result;
  __syncthreads();  // the storage may be reused by the next call
  return all;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Grid-stride index range helpers.
__device__ inline int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t GridThreads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace cohort::compute::cuda
