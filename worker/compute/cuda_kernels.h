#pragma once
// Host-side launchers of the CUDA backend's kernels (cuda_kernels_*.cu).
// Plain C++17 over raw device pointers and a stream, so that the kernels
// compile with nvcc alone and CudaBackend (cuda_backend*.cc, built by the
// host compiler) owns everything else: memory, errors, cuBLAS. Shapes and
// semantics are those of the Backend op each serves (backend.h); every
// launcher only enqueues work on `stream` and never synchronises. Launch
// errors are read by the caller (cudaGetLastError).
//
// Activations (backend.h, "Activation storage") are arrays of T, the
// storage type: float, or kernel_math::Bf16 where the backend keeps them in
// bf16. Every kernel computes in fp32 either way, widening what it reads and
// rounding (to nearest even) each value it stores, once; an accumulating
// output is widened, added to in fp32 and rounded once. Parameters, their
// gradients and the statistics (mean, rstd, losses, lse, sums) are float.
// The templates are instantiated for both storages in their .cu files.
//
// Determinism: no kernel here uses atomics or a launch shape that depends on
// the device (gpu_launch_plan.h); reductions run in a fixed order.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "worker/compute/bf16_math.h"

namespace cohort::compute::cuda {

using kernel_math::Bf16;

// ---- Encoder (cuda_kernels_encoder.cu) --------------------------------------
// S: the output's storage (T is the sequence length here).
template <typename S>
void EncoderForwardShard(S* out, const int32_t* inp, const float* wte, const float* wpe,
                         int vocab_start, int Vs, int B, int T, int C, cudaStream_t stream);
// Scratch EncoderBackwardShard needs for B*T = n positions and a shard of Vs
// rows: the sorted keys and positions and the radix sort's own storage.
size_t EncoderBackwardScratchBytes(int n, int Vs);
// dwpe may be null. `scratch` holds EncoderBackwardScratchBytes(B*T, Vs).
// Returns the radix sort's status (launch errors are the caller's to read).
template <typename S>
cudaError_t EncoderBackwardShard(float* dwte, float* dwpe, const S* dout, const int32_t* inp,
                                 int vocab_start, int Vs, int B, int T, int C, void* scratch,
                                 cudaStream_t stream);

// ---- LayerNorm, column sums, pointwise (cuda_kernels_pointwise.cu) -----------
template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const float* weight,
                      const float* bias, int N, int C, cudaStream_t stream);
// Floats of scratch the column sums of (rows x columns) need.
size_t ColumnSumScratchFloats(int rows, int columns);
template <typename T>
void LayerNormBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                       const float* weight, const float* mean, const float* rstd, int N, int C,
                       float* scratch, cudaStream_t stream);
// out[c] += sum over rows r of x[r * columns + c], rows in order, in fp32
// (x is an activation or an fp32 partial).
template <typename T>
void AddColumnSums(float* out, const T* x, int rows, int columns, float* scratch,
                   cudaStream_t stream);
// out[r * columns + c] = product[r * columns + c] + bias[c], rounded once:
// the bias of a product that cuBLASLt could not fuse, added to the fp32
// product. product may be out itself where T is float.
template <typename T>
void AddBiasRows(T* out, const float* product, const float* bias, int rows, int columns,
                 cudaStream_t stream);
// out (rows x cols, leading dimension ld_out >= rows) = in (rows x cols,
// leading dimension ld_in) rounded to bf16 (to nearest even), as raw bf16
// bits; the padding rows [rows, ld_out) of each column are zero.
void RoundToBf16(uint16_t* out, const float* in, int rows, int64_t cols, int ld_in, int ld_out,
                 cudaStream_t stream);
template <typename T>
void GeluForward(T* out, const T* inp, size_t n, cudaStream_t stream);
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream);
template <typename T>
void ResidualForward(T* out, const T* inp1, const T* inp2, size_t n, cudaStream_t stream);
template <typename T>
void ResidualBackward(T* dinp1, T* dinp2, const T* dout, size_t n, cudaStream_t stream);

// ---- Fused ops (cuda_kernels_pointwise.cu) ------------------------------------
// residual (N,C) = inp1 + inp2, then LayerNormForward of it into out, mean,
// rstd, in one pass per row. residual may be neither input.
// In bf16 the LayerNorm reads the rounded sums it stored.
template <typename T>
void ResidualLayerNormForward(T* residual, T* out, float* mean, float* rstd, const T* inp1,
                              const T* inp2, const float* weight, const float* bias, int N, int C,
                              cudaStream_t stream);
// grad[i] = gelu'(pre[i]) * product[i], rounded once: GELU's backward where
// the GEMM before it wrote the output gradient's fp32 product (the fallback
// of the DGELU epilogue, where cuBLASLt offers no algorithm for it). product
// may be grad itself where T is float (in place).
template <typename T>
void GeluGradFromProduct(T* grad, const float* product, const T* pre, size_t n,
                         cudaStream_t stream);

// ---- Attention pieces (cuda_kernels_attention.cu); the products are cuBLAS's
// q, k, v (B,NH,T,hs) = the three parts of qkv (B,T,3,NH,hs).
void SplitQkv(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int hs,
              cudaStream_t stream);
// heads (B,NH,T,hs) = x (B,T,NH,hs).
void SplitHeads(float* heads, const float* x, int B, int T, int NH, int hs, cudaStream_t stream);
// out (B,T,NH,hs) = heads (B,NH,T,hs).
void MergeHeads(float* out, const float* heads, int B, int T, int NH, int hs, cudaStream_t stream);
// dqkv (B,T,3,NH,hs) += [dq | dk | dv] (each B,NH,T,hs).
void AccumulateQkvGrad(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T,
                       int NH, int hs, cudaStream_t stream);
// In place over `rows` rows of T scores (row r is query position r % T):
// softmax over columns 0..r%T, zeros after.
void CausalSoftmax(float* att, int64_t rows, int T, cudaStream_t stream);
// In place: datt becomes att * (datt - sum_j att_j datt_j) over the causal
// columns, zeros after.
void CausalSoftmaxBackward(float* datt, const float* att, int64_t rows, int T, cudaStream_t stream);

// ---- bf16 conversions (cuda_kernels_sdpa.cu): attention's, around cuDNN and
// the kernels' fp32 attention --------------------------------------------------
// out[i] = in[i] rounded to bf16 (to nearest even; kernel_math::Bf16Bits), i < n.
void NarrowToBf16(Bf16* out, const float* in, int64_t n, cudaStream_t stream);
// out[i] = the fp32 value of the bf16 in[i] (exact), i < n.
void WidenBf16(float* out, const Bf16* in, int64_t n, cudaStream_t stream);
// acc[i] += grad[i], both bf16: widened, added in fp32, rounded once, i < n.
void AddBf16(Bf16* acc, const Bf16* grad, int64_t n, cudaStream_t stream);

// ---- Cross-entropy (cuda_kernels_loss.cu) ---------------------------------
template <typename T>
void CrossEntropyForward(float* losses, float* lse, const T* logits, const int32_t* targets, int N,
                         int V, int Vp, cudaStream_t stream);
template <typename T>
void CrossEntropyShardMax(float* row_max, const T* logits, int N, int V, int Vs, int vocab_start,
                          cudaStream_t stream);
template <typename T>
void CrossEntropyShardSums(float* sums, const T* logits, const float* row_max,
                           const int32_t* targets, int N, int V, int Vs, int vocab_start,
                           cudaStream_t stream);
void CrossEntropyShardFinish(float* losses, float* lse, const float* row_max, const float* sums,
                             int N, cudaStream_t stream);
// dlogits may be logits itself (in place).
template <typename T>
void CrossEntropyShardBackward(T* dlogits, const T* logits, const float* lse,
                               const int32_t* targets, const float* dlosses, int N, int V, int Vs,
                               int vocab_start, cudaStream_t stream);

// Explicit instantiations for both storages, in each kernel file.
#define COHORT_FOR_EACH_STORAGE(INSTANTIATE) \
  INSTANTIATE(float)                         \
  INSTANTIATE(::cohort::compute::kernel_math::Bf16)

}  // namespace cohort::compute::cuda
