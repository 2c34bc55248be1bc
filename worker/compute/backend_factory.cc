#include "worker/compute/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "worker/compute/cpu_backend.h"
#if COHORT_HAVE_CUDA
#include "worker/compute/cuda_backend.h"
#include "worker/compute/cuda_cudnn_library.h"
#endif

namespace cohort::compute {

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kBf16: return "bf16";
  }
  return "unknown";
}

std::optional<Precision> PrecisionFromName(std::string_view name) {
  for (Precision precision : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
    if (name == PrecisionName(precision)) return precision;
  }
  return std::nullopt;
}

const char* FusedAttentionName(FusedAttention mode) {
  switch (mode) {
    case FusedAttention::kAuto: return "auto";
    case FusedAttention::kCudnn: return "cudnn";
    case FusedAttention::kOff: return "off";
  }
  return "unknown";
}

std::optional<FusedAttention> FusedAttentionFromName(std::string_view name) {
  for (FusedAttention mode : {FusedAttention::kAuto, FusedAttention::kCudnn, FusedAttention::kOff}) {
    if (name == FusedAttentionName(mode)) return mode;
  }
  return std::nullopt;
}

const char* CudaGraphsName(CudaGraphs mode) {
  switch (mode) {
    case CudaGraphs::kAuto: return "auto";
    case CudaGraphs::kOff: return "off";
  }
  return "unknown";
}

std::optional<CudaGraphs> CudaGraphsFromName(std::string_view name) {
  for (CudaGraphs mode : {CudaGraphs::kAuto, CudaGraphs::kOff}) {
    if (name == CudaGraphsName(mode)) return mode;
  }
  return std::nullopt;
}

absl::Status CheckCudnnLoads() {
#if COHORT_HAVE_CUDA
  return CudnnLibrary::Load({}).status();
#else
  return absl::UnimplementedError("this build has no CUDA backend, so no cuDNN attention");
#endif
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
#if COHORT_HAVE_CUDA
      return CreateCudaBackend(CudaBackendOptions{.device_index = options.device_index,
                                                  .precision = options.precision,
                                                  .arena_bytes = options.arena_bytes,
                                                  .fused_attention = options.fused_attention});
#else
      return absl::UnimplementedError(
          "this build has no CUDA backend (nvcc was not found when it was configured)");
#endif
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace cohort::compute
