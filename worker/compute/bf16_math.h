#pragma once
// bf16 conversions per element, for the kernels that move attention's
// operands between the model's fp32 activations and cuDNN's bf16 ones
// (cuda_kernels_sdpa.cu), and for the CPU tests that emulate them. bf16 is
// the upper half of an fp32: widening is exact, narrowing rounds to nearest
// even (as __float2bfloat16_rn does), and a NaN stays a (quiet) NaN.

#include <cstdint>
#include <cstring>

#include "worker/compute/host_device.h"

namespace cohort::compute::kernel_math {

COHORT_HOST_DEVICE uint32_t FloatBits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

COHORT_HOST_DEVICE float FloatOfBits(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// The bf16 (raw bits) nearest to `value`, ties to even.
COHORT_HOST_DEVICE uint16_t Bf16Bits(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// The fp32 value of bf16 bits (exact).
COHORT_HOST_DEVICE float FloatOfBf16(uint16_t bf16) {
  return FloatOfBits(static_cast<uint32_t>(bf16) << 16);
}

// acc + the bf16 gradient `grad`, in fp32: how a bf16 gradient from cuDNN
// joins an fp32 accumulation (the backend's += contract).
COHORT_HOST_DEVICE float AddBf16(float acc, uint16_t grad) { return acc + FloatOfBf16(grad); }

}  // namespace cohort::compute::kernel_math
