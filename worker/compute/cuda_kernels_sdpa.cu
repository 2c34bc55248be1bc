// The per-element conversions around cuDNN's fused attention
// (cuda_backend_attention.cc): the model's fp32 qkv and output gradient
// rounded to bf16 for it, its bf16 output widened into the fp32
// activations, and its bf16 gradient added to the fp32 one. The math is
// bf16_math.h's, which the CPU tests run (bf16_math_test.cc).

#include "worker/compute/bf16_math.h"
#include "worker/compute/cuda_kernels.h"
#include "worker/compute/cuda_reduce.cuh"

namespace cohort::compute::cuda {
namespace {

using gpu_plan::GridStrideBlocks;
using gpu_plan::kThreads;

__global__ void NarrowToBf16Kernel(uint16_t* out, const float* in, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    out[i] = kernel_math::Bf16Bits(in[i]);
  }
}

__global__ void WidenBf16Kernel(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    out[i] = kernel_math::FloatOfBf16(in[i]);
  }
}

__global__ void AddBf16Kernel(float* acc, const uint16_t* grad, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    acc[i] = kernel_math::AddBf16(acc[i], grad[i]);
  }
}

}  // namespace

void NarrowToBf16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  NarrowToBf16Kernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(out, in, n);
}

void WidenBf16(float* out, const uint16_t* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  WidenBf16Kernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(out, in, n);
}

void AddBf16(float* acc, const uint16_t* grad, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  AddBf16Kernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(acc, grad, n);
}

}  // namespace cohort::compute::cuda
