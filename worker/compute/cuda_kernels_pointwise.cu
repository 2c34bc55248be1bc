// LayerNorm, per-column sums (dbias, LayerNorm's dweight), GELU and the
// residual add, and the fused residual add + LayerNorm. LayerNorm gives each row one warp (CUB's warp reduction);
// column sums go through the two-pass plan of gpu_launch_plan.h, rows in
// order within a chunk and chunks in order after, never atomics. The
// per-lane and per-element math is kernel_math.h's, which the CPU tests run.

#include <cuda_bf16.h>

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

using kernel_math::GeluExpArgument;
using kernel_math::GeluFromExp;
using kernel_math::GeluGradFromExp;
using kernel_math::LayerNormGradSums;
using kernel_math::LayerNormInputGrad;
using kernel_math::LayerNormOutput;
using kernel_math::LayerNormRstd;
using kernel_math::LayerNormWeightGradTerm;
using kernel_math::RowMean;
using kernel_math::StridedLayerNormGradSums;
using kernel_math::StridedResidualSum;
using kernel_math::StridedSquaredDeviation;
using kernel_math::StridedSum;

constexpr int kWarpBlockThreads = kWarpSize * kWarpsPerBlock;

// Row n's LayerNorm by its warp, from this lane's share of the row's sum:
// the mean, the rstd from the squared deviations, the output, and mean[n]
// and rstd[n] from lane 0.
__device__ inline void WarpLayerNormRow(float* out, float* mean, float* rstd, const float* x,
                                        const float* weight, const float* bias, int64_t n, int C,
                                        int lane, float lane_sum,
                                        WarpReduceFloat::TempStorage& temp) {
  const float m = RowMean(WarpSumAll(lane_sum, temp), C);
  const float s =
      LayerNormRstd(WarpSumAll(StridedSquaredDeviation(x, C, m, lane, kWarpSize), temp), C);
  float* y = out + n * C;
  for (int c = lane; c < C; c += kWarpSize) y[c] = LayerNormOutput(x[c], m, s, weight[c], bias[c]);
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C) {
  __shared__ WarpReduceFloat::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (n >= N) return;  // whole warps leave; nothing below syncs the block
  const float* x = inp + n * C;
  WarpLayerNormRow(out, mean, rstd, x, weight, bias, n, C, lane, StridedSum(x, C, lane, kWarpSize),
                   temp[warp]);
}

__global__ void LayerNormBackwardKernel(float* dinp, const float* dout, const float* inp,
                                        const float* weight, const float* mean, const float* rstd,
                                        int N, int C) {
  __shared__ WarpReduceFloat::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (n >= N) return;
  const float* dy = dout + n * C;
  const float* x = inp + n * C;
  float* dx = dinp + n * C;
  const float m = mean[n];
  const float s = rstd[n];
  const LayerNormGradSums sums = StridedLayerNormGradSums(dy, x, weight, m, s, C, lane, kWarpSize);
  const float dnorm_mean = RowMean(WarpSumAll(sums.dnorm, temp[warp]), C);
  const float dnorm_norm_mean = RowMean(WarpSumAll(sums.dnorm_norm, temp[warp]), C);
  for (int c = lane; c < C; c += kWarpSize) {
    dx[c] += LayerNormInputGrad(x[c], weight[c], dy[c], m, s, dnorm_mean, dnorm_norm_mean);
  }
}

// The terms a column sum adds: x[r, c] itself, or LayerNorm's dweight term.
struct PlainTerm {
  const float* x;
  int columns;
  __device__ float operator()(int64_t r, int c) const { return x[r * columns + c]; }
};
struct LayerNormWeightTerm {
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  int columns;
  __device__ float operator()(int64_t r, int c) const {
    const int64_t i = r * columns + c;
    return LayerNormWeightGradTerm(inp[i], mean[r], rstd[r], dout[i]);
  }
};

// partial[chunk, c] = sum of term(r, c) over the chunk's rows, in order.
template <typename Term>
__global__ void ColumnPartialKernel(float* partial, Term term, int rows, int columns,
                                    int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= columns) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float acc = 0.0f;
  for (int64_t r = begin; r < end; ++r) acc += term(r, c);
  partial[chunk * columns + c] = acc;
}

// out[c] += the partials of column c, in chunk order.
__global__ void ColumnFinishKernel(float* out, const float* partial, int chunks, int columns) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= columns) return;
  float acc = 0.0f;
  for (int k = 0; k < chunks; ++k) acc += partial[static_cast<int64_t>(k) * columns + c];
  out[c] += acc;
}

template <typename Term>
void AddColumnSumsOf(float* out, Term term, int rows, int columns, float* scratch,
                     cudaStream_t stream) {
  const gpu_plan::ColumnReducePlan plan = gpu_plan::PlanColumnReduce(rows);
  if (plan.chunks == 0 || columns <= 0) return;
  const dim3 grid((columns + kThreads - 1) / kThreads, plan.chunks);
  ColumnPartialKernel<<<grid, kThreads, 0, stream>>>(scratch, term, rows, columns,
                                                     plan.rows_per_chunk);
  ColumnFinishKernel<<<(columns + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      out, scratch, plan.chunks, columns);
}

__global__ void BroadcastRowsKernel(float* out, const float* bias, int columns, int64_t total) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) out[i] = bias[i % columns];
}

__global__ void RoundToBf16Kernel(__nv_bfloat16* out, const float* in, int rows, int ld_in,
                                  int ld_out, int64_t total) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t col = i / ld_out;
    const int row = static_cast<int>(i % ld_out);
    out[i] = row < rows ? __float2bfloat16_rn(in[col * ld_in + row]) : __float2bfloat16_rn(0.0f);
  }
}

__global__ void GeluForwardKernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float x = inp[i];
    out[i] = GeluFromExp(x, expf(GeluExpArgument(x)));
  }
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float x = inp[i];
    dinp[i] += GeluGradFromExp(x, expf(GeluExpArgument(x))) * dout[i];
  }
}

__global__ void ResidualForwardKernel(float* out, const float* inp1, const float* inp2, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) out[i] = inp1[i] + inp2[i];
}

__global__ void ResidualBackwardKernel(float* dinp1, float* dinp2, const float* dout, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

// One warp per row, like LayerNormForwardKernel. Each lane writes the sums of
// its own columns (first = lane, stride = warp) and the LayerNorm's passes
// read back exactly those columns by the same lane, so no other thread's
// write is read and no barrier is needed; the re-reads hit the cache the
// writes just filled instead of a second kernel's trip through memory.
__global__ void ResidualLayerNormForwardKernel(float* residual, float* out, float* mean,
                                               float* rstd, const float* inp1, const float* inp2,
                                               const float* weight, const float* bias, int N,
                                               int C) {
  __shared__ WarpReduceFloat::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (n >= N) return;  // whole warps leave; nothing below syncs the block
  float* x = residual + n * C;
  const float lane_sum = StridedResidualSum(x, inp1 + n * C, inp2 + n * C, C, lane, kWarpSize);
  WarpLayerNormRow(out, mean, rstd, x, weight, bias, n, C, lane, lane_sum, temp[warp]);
}

__global__ void GeluGradInPlaceKernel(float* grad, const float* pre, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float x = pre[i];
    grad[i] = GeluGradFromExp(x, expf(GeluExpArgument(x))) * grad[i];
  }
}

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, cudaStream_t stream) {
  if (N <= 0) return;
  LayerNormForwardKernel<<<WarpRowBlocks(N), kWarpBlockThreads, 0, stream>>>(out, mean, rstd, inp,
                                                                             weight, bias, N, C);
}

size_t ColumnSumScratchFloats(int rows, int columns) {
  return static_cast<size_t>(gpu_plan::PlanColumnReduce(rows).chunks) *
         static_cast<size_t>(columns > 0 ? columns : 0);
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, float* scratch, cudaStream_t stream) {
  if (N <= 0) return;
  LayerNormBackwardKernel<<<WarpRowBlocks(N), kWarpBlockThreads, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  // The two sums share the scratch: the stream runs them one after the other.
  AddColumnSumsOf(dweight, LayerNormWeightTerm{dout, inp, mean, rstd, C}, N, C, scratch, stream);
  AddColumnSumsOf(dbias, PlainTerm{dout, C}, N, C, scratch, stream);
}

void AddColumnSums(float* out, const float* x, int rows, int columns, float* scratch,
                   cudaStream_t stream) {
  AddColumnSumsOf(out, PlainTerm{x, columns}, rows, columns, scratch, stream);
}

void BroadcastRows(float* out, const float* bias, int rows, int columns, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * columns;
  BroadcastRowsKernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(out, bias,
                                                                                  columns, total);
}

void RoundToBf16(uint16_t* out, const float* in, int rows, int64_t cols, int ld_in, int ld_out,
                 cudaStream_t stream) {
  const int64_t total = cols * ld_out;
  RoundToBf16Kernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(
      reinterpret_cast<__nv_bfloat16*>(out), in, rows, ld_in, ld_out, total);
}

void GeluForward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  const auto count = static_cast<int64_t>(n);
  GeluForwardKernel<<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(out, inp, count);
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n, cudaStream_t stream) {
  const auto count = static_cast<int64_t>(n);
  GeluBackwardKernel<<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(dinp, inp, dout,
                                                                                 count);
}

void ResidualForward(float* out, const float* inp1, const float* inp2, size_t n,
                     cudaStream_t stream) {
  const auto count = static_cast<int64_t>(n);
  ResidualForwardKernel<<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(out, inp1, inp2,
                                                                                    count);
}

void ResidualBackward(float* dinp1, float* dinp2, const float* dout, size_t n,
                      cudaStream_t stream) {
  const auto count = static_cast<int64_t>(n);
  ResidualBackwardKernel<<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(dinp1, dinp2,
                                                                                     dout, count);
}

void ResidualLayerNormForward(float* residual, float* out, float* mean, float* rstd,
                              const float* inp1, const float* inp2, const float* weight,
                              const float* bias, int N, int C, cudaStream_t stream) {
  if (N <= 0) return;
  ResidualLayerNormForwardKernel<<<WarpRowBlocks(N), kWarpBlockThreads, 0, stream>>>(
      residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
}

void GeluGradInPlace(float* grad, const float* pre, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GeluGradInPlaceKernel<<<GridStrideBlocks(static_cast<int64_t>(n), kThreads), kThreads, 0,
                          stream>>>(grad, pre, static_cast<int64_t>(n));
}

}  // namespace cohort::compute::cuda
