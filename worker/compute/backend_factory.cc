#include "worker/compute/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::compute {

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kBf16: return "bf16";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be >= 0 (0 = all cores), got ", options.num_threads));
  }
  switch (options.kind) {
    case BackendKind::kCpu:
      if (options.precision != Precision::kFp32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the CPU backend computes in fp32; precision ", PrecisionName(options.precision),
            " needs a GPU"));
      }
      return std::make_unique<CpuBackend>(CpuBackendOptions{.num_threads = options.num_threads});
    case BackendKind::kCuda:
      return absl::UnimplementedError("the CUDA compute backend is not built yet; use the CPU");
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace cohort::compute
