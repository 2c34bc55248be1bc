#pragma once
// bf16 conversions per element: the storage of activations in bf16
// (backend.h, "Activation storage": the CUDA kernels are templated on the
// storage type, float or Bf16, and read through Widen and write through
// Store), the rounding of fp32 operands for the bf16 GEMMs, and the CPU
// tests that run the same functions. bf16 is the upper half of an fp32:
// widening is exact, narrowing rounds to nearest even (as
// __float2bfloat16_rn does), and a NaN stays a (quiet) NaN.

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

// acc + the bf16 gradient `grad`, in fp32: how a bf16 gradient joins an
// fp32 accumulation (the backend's += contract).
COHORT_HOST_DEVICE float AddBf16(float acc, uint16_t grad) { return acc + FloatOfBf16(grad); }

// ---- Activation storage ----------------------------------------------------------
// An activation stored in bf16: its raw bits, as a type of its own so that
// code templated on the storage type (float or Bf16) cannot take an
// integer for it. Two bytes, trivially copyable: device memory of bf16
// elements is an array of it.
struct Bf16 {
  uint16_t bits;
};

// A stored activation's value in fp32 (exact for both storages).
COHORT_HOST_DEVICE float Widen(float value) { return value; }
COHORT_HOST_DEVICE float Widen(Bf16 value) { return FloatOfBf16(value.bits); }

// An fp32 result as storage T holds it: itself, or rounded to the nearest
// bf16 (ties to even).
template <typename T>
COHORT_HOST_DEVICE T Narrow(float value);
template <>
COHORT_HOST_DEVICE float Narrow<float>(float value) {
  return value;
}
template <>
COHORT_HOST_DEVICE Bf16 Narrow<Bf16>(float value) {
  return Bf16{Bf16Bits(value)};
}

// *at = value, rounded once where T is bf16.
template <typename T>
COHORT_HOST_DEVICE void Store(T* at, float value) {
  *at = Narrow<T>(value);
}

// The fp32 value `value` has once stored as T (what a later read of it
// widens to).
template <typename T>
COHORT_HOST_DEVICE float Stored(float value) {
  return Widen(Narrow<T>(value));
}

// *at += value: widened, added in fp32, rounded once (the accumulating
// outputs' rule).
template <typename T>
COHORT_HOST_DEVICE void Accumulate(T* at, float value) {
  Store(at, Widen(*at) + value);
}

}  // namespace cohort::compute::kernel_math
