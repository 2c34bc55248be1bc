// The per-element bf16 conversions around attention
// (cuda_backend_attention*.cc): cuDNN's bf16 gradient added to the bf16
// dqkv (the += contract: widened, added in fp32, rounded once), and the
// kernels' attention, which computes on fp32 copies of the bf16
// activations, widening them on entry and rounding its results on exit. The
// math is bf16_math.h's, which the CPU tests run (bf16_math_test.cc).

#include "worker/compute/bf16_math.h"
#include "worker/compute/cuda_kernels.h"
#include "worker/compute/cuda_reduce.cuh"

namespace cohort::compute::cuda {
namespace {

using gpu_plan::GridStrideBlocks;
using gpu_plan::kThreads;

__global__ void NarrowToBf16Kernel(Bf16* out, const float* in, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) kernel_math::Store(&out[i], in[i]);
}

__global__ void WidenBf16Kernel(float* out, const Bf16* in, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) out[i] = kernel_math::Widen(in[i]);
}

__global__ void AddBf16Kernel(Bf16* acc, const Bf16* grad, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    kernel_math::Accumulate(&acc[i], kernel_math::Widen(grad[i]));
  }
}

}  // namespace

void NarrowToBf16(Bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  NarrowToBf16Kernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(out, in, n);
}

void WidenBf16(float* out, const Bf16* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  WidenBf16Kernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(out, in, n);
}

void AddBf16(Bf16* acc, const Bf16* grad, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  AddBf16Kernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(acc, grad, n);
}

}  // namespace cohort::compute::cuda
