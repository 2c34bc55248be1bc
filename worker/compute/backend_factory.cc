#include "worker/compute/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::compute {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be >= 0 (0 = all cores), got ", options.num_threads));
  }
  switch (options.kind) {
    case BackendKind::kCpu:
      return std::make_unique<CpuBackend>(CpuBackendOptions{.num_threads = options.num_threads});
    case BackendKind::kCuda:
      return absl::UnimplementedError("the CUDA compute backend is not built yet; use the CPU");
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace cohort::compute
