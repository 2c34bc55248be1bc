#pragma once
// Host-side movement of activations in a backend's activation dtype
// (backend.h, "Activation storage"), for the tests that compare a backend
// storing them in bf16 with an fp32 reference: values rounded as the
// backend stores them (so the reference sees the same inputs), uploads as
// the dtype's bits and downloads widened to fp32.

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/backend.h"
#include "worker/compute/bf16_math.h"

namespace cohort::compute::activation_io {

// `values` as activations of `dtype` hold them: rounded to bf16 (to nearest
// even) for kBFloat16, unchanged for kFloat32.
inline std::vector<float> AsStored(DType dtype, std::vector<float> values) {
  if (dtype == DType::kBFloat16) {
    for (float& v : values) v = kernel_math::FloatOfBf16(kernel_math::Bf16Bits(v));
  }
  return values;
}

// A new buffer of `dtype` (kFloat32 or kBFloat16) on `backend` holding
// `host` (rounded for bf16).
inline Buffer UploadAs(Backend& backend, DType dtype, const std::vector<float>& host) {
  absl::StatusOr<Buffer> buffer = backend.Allocate(dtype, host.size());
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return Buffer();
  if (dtype == DType::kBFloat16) {
    std::vector<uint16_t> bits(host.size());
    for (size_t i = 0; i < host.size(); ++i) bits[i] = kernel_math::Bf16Bits(host[i]);
    backend.CopyFromHost(buffer->span(), bits.data());
  } else {
    backend.CopyFromHost(buffer->span(), host.data());
  }
  return *std::move(buffer);
}

// The fp32 or bf16 elements of `span`, widened to fp32 (exact).
inline std::vector<float> DownloadWidened(Backend& backend, TensorSpan span) {
  std::vector<float> host(span.numel);
  if (span.dtype == DType::kBFloat16) {
    std::vector<uint16_t> bits(span.numel);
    backend.CopyToHost(bits.data(), span);
    for (size_t i = 0; i < bits.size(); ++i) host[i] = kernel_math::FloatOfBf16(bits[i]);
  } else {
    backend.CopyToHost(host.data(), span);
  }
  return host;
}

}  // namespace cohort::compute::activation_io
