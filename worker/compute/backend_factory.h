#pragma once
// CreateBackend: builds the compute Backend a worker's configuration names.

#include <memory>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"

namespace cohort::compute {

enum class BackendKind { kCpu, kCuda };

struct BackendOptions {
  BackendKind kind = BackendKind::kCpu;
  // CPU: OpenMP and OpenBLAS threads; 0 = omp_get_max_threads(). >= 0.
  int num_threads = 0;
};

// A new backend owned by the caller. InvalidArgument for a negative thread
// count; Unimplemented for a kind this build does not provide (CUDA, for now).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace cohort::compute
