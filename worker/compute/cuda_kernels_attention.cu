// The non-product parts of causal attention: moving heads between the
// (B,T,NH,hs) layout of the model's activations and the (B,NH,T,hs) layout
// of cuBLAS's strided batches, and the causal softmax and its backward (one
// warp per row of scores, CUB's warp reductions). The products themselves
// are strided-batched GEMMs issued by CudaBackend. The index maps and the
// softmax's per-lane math are kernel_math.h's, which the CPU tests run.

#include <math.h>

#include "worker/compute/cuda_kernels.h"
#include "worker/compute/cuda_reduce.cuh"
#include "worker/compute/kernel_math.h"

namespace cohort::compute::cuda {
namespace {

using gpu_plan::GridStrideBlocks;
using gpu_plan::kThreads;
using gpu_plan::kWarpSize;
using gpu_plan::kWarpsPerBlock;
using gpu_plan::WarpRowBlocks;

constexpr int kWarpBlockThreads = kWarpSize * kWarpsPerBlock;

using kernel_math::CausalColumns;
using kernel_math::SoftmaxInputGrad;
using kernel_math::StridedDot;
using kernel_math::StridedExpShiftedSum;
using kernel_math::StridedMax;
using kernel_math::TokenMajorIndex;

__global__ void SplitQkvKernel(float* q, float* k, float* v, const float* qkv, int T, int NH,
                               int hs, int64_t total) {
  const int64_t C = static_cast<int64_t>(NH) * hs;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t src = TokenMajorIndex(i, T, NH, hs, 3);
    q[i] = qkv[src];
    k[i] = qkv[src + C];
    v[i] = qkv[src + 2 * C];
  }
}

__global__ void SplitHeadsKernel(float* heads, const float* x, int T, int NH, int hs,
                                 int64_t total) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    heads[i] = x[TokenMajorIndex(i, T, NH, hs, 1)];
  }
}

__global__ void MergeHeadsKernel(float* out, const float* heads, int T, int NH, int hs,
                                 int64_t total) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    out[TokenMajorIndex(i, T, NH, hs, 1)] = heads[i];
  }
}

__global__ void AccumulateQkvGradKernel(float* dqkv, const float* dq, const float* dk,
                                        const float* dv, int T, int NH, int hs, int64_t total) {
  const int64_t C = static_cast<int64_t>(NH) * hs;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t dst = TokenMajorIndex(i, T, NH, hs, 3);
    dqkv[dst] += dq[i];
    dqkv[dst + C] += dk[i];
    dqkv[dst + 2 * C] += dv[i];
  }
}

__global__ void CausalSoftmaxKernel(float* att, int64_t rows, int T) {
  __shared__ WarpReduceFloat::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (r >= rows) return;
  float* row = att + r * T;
  const int valid = CausalColumns(r, T);
  const float maxval = WarpMaxAll(StridedMax(row, valid, lane, kWarpSize), temp[warp]);
  // Each lane rewrites only the columns it reads.
  const float sum = StridedExpShiftedSum(row, valid, maxval, lane, kWarpSize);
  const float inv = 1.0f / WarpSumAll(sum, temp[warp]);
  for (int j = lane; j < valid; j += kWarpSize) row[j] *= inv;
  for (int j = valid + lane; j < T; j += kWarpSize) row[j] = 0.0f;
}

__global__ void CausalSoftmaxBackwardKernel(float* datt, const float* att, int64_t rows, int T) {
  __shared__ WarpReduceFloat::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (r >= rows) return;
  float* drow = datt + r * T;
  const float* row = att + r * T;
  const int valid = CausalColumns(r, T);
  const float dot = WarpSumAll(StridedDot(row, drow, valid, lane, kWarpSize), temp[warp]);
  for (int j = lane; j < valid; j += kWarpSize) drow[j] = SoftmaxInputGrad(row[j], drow[j], dot);
  for (int j = valid + lane; j < T; j += kWarpSize) drow[j] = 0.0f;
}

int64_t HeadElements(int B, int T, int NH, int hs) { return static_cast<int64_t>(B) * NH * T * hs; }

}  // namespace

void SplitQkv(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int hs,
              cudaStream_t stream) {
  const int64_t total = HeadElements(B, T, NH, hs);
  SplitQkvKernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(q, k, v, qkv, T, NH,
                                                                             hs, total);
}

void SplitHeads(float* heads, const float* x, int B, int T, int NH, int hs, cudaStream_t stream) {
  const int64_t total = HeadElements(B, T, NH, hs);
  SplitHeadsKernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(heads, x, T, NH, hs,
                                                                               total);
}

void MergeHeads(float* out, const float* heads, int B, int T, int NH, int hs, cudaStream_t stream) {
  const int64_t total = HeadElements(B, T, NH, hs);
  MergeHeadsKernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(out, heads, T, NH,
                                                                               hs, total);
}

void AccumulateQkvGrad(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T,
                       int NH, int hs, cudaStream_t stream) {
  const int64_t total = HeadElements(B, T, NH, hs);
  AccumulateQkvGradKernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(
      dqkv, dq, dk, dv, T, NH, hs, total);
}

void CausalSoftmax(float* att, int64_t rows, int T, cudaStream_t stream) {
  if (rows <= 0) return;
  CausalSoftmaxKernel<<<WarpRowBlocks(rows), kWarpBlockThreads, 0, stream>>>(att, rows, T);
}

void CausalSoftmaxBackward(float* datt, const float* att, int64_t rows, int T,
                           cudaStream_t stream) {
  if (rows <= 0) return;
  CausalSoftmaxBackwardKernel<<<WarpRowBlocks(rows), kWarpBlockThreads, 0, stream>>>(datt, att,
                                                                                     rows, T);
}

}  // namespace cohort::compute::cuda
