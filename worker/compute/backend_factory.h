#pragma once
// CreateBackend: builds the compute Backend a worker's configuration names.

#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"

namespace cohort::compute {

enum class BackendKind { kCpu, kCuda };

// The arithmetic of the matmuls and activations (JobSpec model.precision):
// master weights, optimizer state, gradient sums and the loss stay fp32.
enum class Precision { kFp32, kTf32, kBf16 };
const char* PrecisionName(Precision precision);  // "fp32", "tf32", "bf16"
// The precision PrecisionName names `name`; nullopt for any other string.
std::optional<Precision> PrecisionFromName(std::string_view name);

struct BackendOptions {
  BackendKind kind = BackendKind::kCpu;
  // CPU: OpenMP and OpenBLAS threads; 0 = omp_get_max_threads(). >= 0.
  int num_threads = 0;
  Precision precision = Precision::kFp32;
  // CUDA: the device index (>= 0), and the device memory reserved up front
  // for the backend's buffers (0: allocated on demand; cuda_backend.h).
  int device_index = 0;
  size_t arena_bytes = 0;
};

// A new backend owned by the caller. InvalidArgument for a negative thread
// count or a precision the kind does not compute in (the CPU: fp32 only);
// Unimplemented for a kind this build does not provide (CUDA where nvcc was
// missing); the CUDA backend's own
// errors otherwise (cuda_backend.h: FailedPrecondition without a device).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace cohort::compute
