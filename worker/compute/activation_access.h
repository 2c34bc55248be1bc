#pragma once
// Typed access to activation spans (backend.h, "Activation storage") for a
// backend whose kernels are templated on the storage type: float for fp32
// activations, kernel_math::Bf16 (bf16_math.h) for bf16 ones. An op picks the
// storage type from the backend's activation dtype once (WithStorage) and
// takes each activation span as that type (CheckedActivation), which CHECKs
// the span's dtype as span_checks.h checks the fp32 ones: a span of another
// dtype is a programmer error. Host code only; no CUDA header.

#include <cstddef>
#include <type_traits>

#include "common/log.h"
#include "worker/compute/backend.h"
#include "worker/compute/bf16_math.h"

namespace cohort::compute {

// The DType of storage type T (float or Bf16, const or not).
template <typename T>
constexpr DType StorageDType() {
  using Bare = std::remove_const_t<T>;
  static_assert(std::is_same_v<Bare, float> || std::is_same_v<Bare, kernel_math::Bf16>,
                "activations are stored as float or Bf16");
  return std::is_same_v<Bare, float> ? DType::kFloat32 : DType::kBFloat16;
}

// The span's elements as T, after checking that its dtype is T's and that
// it holds at least `min_numel` of them. `what` names the argument.
template <typename T>
T* CheckedActivation(TensorSpan span, size_t min_numel, const char* what) {
  CHECK(span.dtype == StorageDType<T>())
      << what << ": want " << DTypeName(StorageDType<T>()) << ", got " << DTypeName(span.dtype);
  CHECK(span.data != nullptr) << what << ": empty span";
  CHECK(span.numel >= min_numel) << what << ": " << span.numel << " elements, need " << min_numel;
  return static_cast<T*>(span.data);
}

// Like CheckedActivation for optional arguments: nullptr for an empty span.
template <typename T>
T* OptionalActivation(TensorSpan span, size_t min_numel, const char* what) {
  return span.empty() ? nullptr : CheckedActivation<T>(span, min_numel, what);
}

// Calls body(T{}) with T the storage type of `dtype`: float for kFloat32,
// kernel_math::Bf16 for kBFloat16. CHECKs that it is one of them.
template <typename Body>
void WithStorage(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::kFloat32:
      body(float{});
      return;
    case DType::kBFloat16:
      body(kernel_math::Bf16{});
      return;
    default:
      CHECK(false) << "activations are stored in float32 or bfloat16, not " << DTypeName(dtype);
  }
}

}  // namespace cohort::compute
