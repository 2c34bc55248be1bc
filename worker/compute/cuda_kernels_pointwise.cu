// LayerNorm, per-column sums (dbias, LayerNorm's dweight), GELU and the
// residual add, and the fused residual add + LayerNorm. LayerNorm gives each row one warp (CUB's
// warp reduction); column sums go through the two-pass plan of gpu_launch_plan.h, rows in order
// within a chunk and chunks in order after, never atomics. The per-lane and per-element math is
// kernel_math.h's, which the CPU tests run. Activations are T (float or Bf16: cuda_kernels.h), read
// through Widen and written through Store/Accumulate (bf16_math.h).

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

using kernel_math::Accumulate;
using kernel_math::GeluExpArgument;
using kernel_math::GeluFromExp;
using kernel_math::GeluGradFromExp;
using kernel_math::LayerNormGradSums;
using kernel_math::LayerNormInputGrad;
using kernel_math::LayerNormOutput;
using kernel_math::LayerNormRstd;
using kernel_math::LayerNormWeightGradTerm;
using kernel_math::RowMean;
using kernel_math::Store;
using kernel_math::StridedLayerNormGradSums;
using kernel_math::StridedResidualSum;
using kernel_math::StridedSquaredDeviation;
using kernel_math::StridedSum;
using kernel_math::Widen;

constexpr int kWarpBlockThreads = kWarpSize * kWarpsPerBlock;

// Row n's LayerNorm by its warp, from this lane's share of the row's sum:
// the mean, the rstd from the squared deviations, the output, and mean[n]
// and rstd[n] from lane 0.
template <typename T>
__device__ inline void WarpLayerNormRow(T* out, float* mean, float* rstd, const T* x,
                                        const float* weight, const float* bias, int64_t n, int C,
                                        int lane, float lane_sum,
                                        WarpReduceFloat::TempStorage& temp) {
  const float m = RowMean(WarpSumAll(lane_sum, temp), C);
  const float s =
      LayerNormRstd(WarpSumAll(StridedSquaredDeviation(x, C, m, lane, kWarpSize), temp), C);
  T* y = out + n * C;
  for (int c = lane; c < C; c += kWarpSize) {
    Store(&y[c], LayerNormOutput(Widen(x[c]), m, s, weight[c], bias[c]));
  }
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp,
                                       const float* weight, const float* bias, int N, int C) {
  __shared__ WarpReduceFloat::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (n >= N) return;  // whole warps leave; nothing below syncs the block
  const T* x = inp + n * C;
  WarpLayerNormRow(out, mean, rstd, x, weight, bias, n, C, lane, StridedSum(x, C, lane, kWarpSize),
                   temp[warp]);
}

template <typename T>
__global__ void LayerNormBackwardKernel(T* dinp, const T* dout, const T* inp, const float* weight,
                                        const float* mean, const float* rstd, int N, int C) {
  __shared__ WarpReduceFloat::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (n >= N) return;
  const T* dy = dout + n * C;
  const T* x = inp + n * C;
  T* dx = dinp + n * C;
  const float m = mean[n];
  const float s = rstd[n];
  const LayerNormGradSums sums = StridedLayerNormGradSums(dy, x, weight, m, s, C, lane, kWarpSize);
  const float dnorm_mean = RowMean(WarpSumAll(sums.dnorm, temp[warp]), C);
  const float dnorm_norm_mean = RowMean(WarpSumAll(sums.dnorm_norm, temp[warp]), C);
  for (int c = lane; c < C; c += kWarpSize) {
    Accumulate(&dx[c], LayerNormInputGrad(Widen(x[c]), weight[c], Widen(dy[c]), m, s, dnorm_mean,
                                          dnorm_norm_mean));
  }
}

// The terms a column sum adds: x[r, c] itself, or LayerNorm's dweight term.
template <typename T>
struct PlainTerm {
  const T* x;
  int columns;
  __device__ float operator()(int64_t r, int c) const { return Widen(x[r * columns + c]); }
};
template <typename T>
struct LayerNormWeightTerm {
  const T* dout;
  const T* inp;
  const float* mean;
  const float* rstd;
  int columns;
  __device__ float operator()(int64_t r, int c) const {
    const int64_t i = r * columns + c;
    return LayerNormWeightGradTerm(Widen(inp[i]), mean[r], rstd[r], Widen(dout[i]));
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

// Element i is read and written by one thread only, so product may be out.
template <typename T>
__global__ void AddBiasRowsKernel(T* out, const float* product, const float* bias, int columns,
                                  int64_t total) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    Store(&out[i], product[i] + bias[i % columns]);
  }
}

__global__ void RoundToBf16Kernel(__nv_bfloat16* out, const float* in, int rows, int ld_in,
                                  int ld_out, int64_t total) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t col = i / ld_out;
    const int row = static_cast<int>(i % ld_out);
    out[i] = row < rows ? __float2bfloat16_rn(in[col * ld_in + row]) : __float2bfloat16_rn(0.0f);
  }
}

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float x = Widen(inp[i]);
    Store(&out[i], GeluFromExp(x, expf(GeluExpArgument(x))));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float x = Widen(inp[i]);
    Accumulate(&dinp[i], GeluGradFromExp(x, expf(GeluExpArgument(x))) * Widen(dout[i]));
  }
}

// out may be inp1 or inp2: element i is read, then written, by one thread.
template <typename T>
__global__ void ResidualForwardKernel(T* out, const T* inp1, const T* inp2, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    Store(&out[i], Widen(inp1[i]) + Widen(inp2[i]));
  }
}

template <typename T>
__global__ void ResidualBackwardKernel(T* dinp1, T* dinp2, const T* dout, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float dy = Widen(dout[i]);
    Accumulate(&dinp1[i], dy);
    Accumulate(&dinp2[i], dy);
  }
}

// One warp per row, like LayerNormForwardKernel. Each lane writes the sums of
// its own columns (first = lane, stride = warp) and the LayerNorm's passes
// read back exactly those columns by the same lane, so no other thread's
// write is read and no barrier is needed; the re-reads hit the cache the
// writes just filled instead of a second kernel's trip through memory.
template <typename T>
__global__ void ResidualLayerNormForwardKernel(T* residual, T* out, float* mean, float* rstd,
                                               const T* inp1, const T* inp2, const float* weight,
                                               const float* bias, int N, int C) {
  __shared__ WarpReduceFloat::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (n >= N) return;  // whole warps leave; nothing below syncs the block
  T* x = residual + n * C;
  const float lane_sum = StridedResidualSum(x, inp1 + n * C, inp2 + n * C, C, lane, kWarpSize);
  WarpLayerNormRow(out, mean, rstd, x, weight, bias, n, C, lane, lane_sum, temp[warp]);
}

// Element i is read and written by one thread only, so product may be grad.
template <typename T>
__global__ void GeluGradFromProductKernel(T* grad, const float* product, const T* pre, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float x = Widen(pre[i]);
    Store(&grad[i], GeluGradFromExp(x, expf(GeluExpArgument(x))) * product[i]);
  }
}

}  // namespace

template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const float* weight,
                      const float* bias, int N, int C, cudaStream_t stream) {
  if (N <= 0) return;
  LayerNormForwardKernel<<<WarpRowBlocks(N), kWarpBlockThreads, 0, stream>>>(out, mean, rstd, inp,
                                                                             weight, bias, N, C);
}

size_t ColumnSumScratchFloats(int rows, int columns) {
  return static_cast<size_t>(gpu_plan::PlanColumnReduce(rows).chunks) *
         static_cast<size_t>(columns > 0 ? columns : 0);
}

template <typename T>
void LayerNormBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                       const float* weight, const float* mean, const float* rstd, int N, int C,
                       float* scratch, cudaStream_t stream) {
  if (N <= 0) return;
  LayerNormBackwardKernel<<<WarpRowBlocks(N), kWarpBlockThreads, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  // The two sums share the scratch: the stream runs them one after the other.
  AddColumnSumsOf(dweight, LayerNormWeightTerm<T>{dout, inp, mean, rstd, C}, N, C, scratch, stream);
  AddColumnSumsOf(dbias, PlainTerm<T>{dout, C}, N, C, scratch, stream);
}

template <typename T>
void AddColumnSums(float* out, const T* x, int rows, int columns, float* scratch,
                   cudaStream_t stream) {
  AddColumnSumsOf(out, PlainTerm<T>{x, columns}, rows, columns, scratch, stream);
}

template <typename T>
void AddBiasRows(T* out, const float* product, const float* bias, int rows, int columns,
                 cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * columns;
  if (total <= 0) return;
  AddBiasRowsKernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(out, product, bias,
                                                                                columns, total);
}

void RoundToBf16(uint16_t* out, const float* in, int rows, int64_t cols, int ld_in, int ld_out,
                 cudaStream_t stream) {
  const int64_t total = cols * ld_out;
  RoundToBf16Kernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(
      reinterpret_cast<__nv_bfloat16*>(out), in, rows, ld_in, ld_out, total);
}

template <typename T>
void GeluForward(T* out, const T* inp, size_t n, cudaStream_t stream) {
  const auto count = static_cast<int64_t>(n);
  GeluForwardKernel<<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(out, inp, count);
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream) {
  const auto count = static_cast<int64_t>(n);
  GeluBackwardKernel<<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(dinp, inp, dout,
                                                                                 count);
}

template <typename T>
void ResidualForward(T* out, const T* inp1, const T* inp2, size_t n, cudaStream_t stream) {
  const auto count = static_cast<int64_t>(n);
  ResidualForwardKernel<<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(out, inp1, inp2,
                                                                                    count);
}

template <typename T>
void ResidualBackward(T* dinp1, T* dinp2, const T* dout, size_t n, cudaStream_t stream) {
  const auto count = static_cast<int64_t>(n);
  ResidualBackwardKernel<<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(dinp1, dinp2,
                                                                                     dout, count);
}

template <typename T>
void ResidualLayerNormForward(T* residual, T* out, float* mean, float* rstd, const T* inp1,
                              const T* inp2, const float* weight, const float* bias, int N, int C,
                              cudaStream_t stream) {
  if (N <= 0) return;
  ResidualLayerNormForwardKernel<<<WarpRowBlocks(N), kWarpBlockThreads, 0, stream>>>(
      residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
}

template <typename T>
void GeluGradFromProduct(T* grad, const float* product, const T* pre, size_t n,
                         cudaStream_t stream) {
  if (n == 0) return;
  GeluGradFromProductKernel<<<GridStrideBlocks(static_cast<int64_t>(n), kThreads), kThreads, 0,
                              stream>>>(grad, product, pre, static_cast<int64_t>(n));
}

#define COHORT_INSTANTIATE_POINTWISE(T)                                                            \
  template void LayerNormForward<T>(T*, float*, float*, const T*, const float*, const float*, int, \
                                    int, cudaStream_t);                                            \
  template void LayerNormBackward<T>(T*, float*, float*, const T*, const T*, const float*,         \
                                     const float*, const float*, int, int, float*, cudaStream_t);  \
  template void AddColumnSums<T>(float*, const T*, int, int, float*, cudaStream_t);                \
  template void AddBiasRows<T>(T*, const float*, const float*, int, int, cudaStream_t);            \
  template void GeluForward<T>(T*, const T*, size_t, cudaStream_t);                                \
  template void GeluBackward<T>(T*, const T*, const T*, size_t, cudaStream_t);                     \
  template void ResidualForward<T>(T*, const T*, const T*, size_t, cudaStream_t);                  \
  template void ResidualBackward<T>(T*, T*, const T*, size_t, cudaStream_t);                       \
  template void ResidualLayerNormForward<T>(T*, T*, float*, float*, const T*, const T*,            \
                                            const float*, const float*, int, int, cudaStream_t);   \
  template void GeluGradFromProduct<T>(T*, const float*, const T*, size_t, cudaStream_t);
COHORT_FOR_EACH_STORAGE(COHORT_INSTANTIATE_POINTWISE)
#undef COHORT_INSTANTIATE_POINTWISE

}  // namespace cohort::compute::cuda
