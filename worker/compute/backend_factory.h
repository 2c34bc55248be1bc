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

// How a CUDA backend runs causal attention (the worker's --fused_attention):
// kAuto: cuDNN's fused flash attention where cuDNN loads and plans the
// session's shapes (precision bf16 only), else the backend's own kernels;
// kCudnn: cuDNN's or an error when the backend is set up; kOff: the kernels.
// The CPU backend ignores it.
enum class FusedAttention { kAuto, kCudnn, kOff };
const char* FusedAttentionName(FusedAttention mode);  // "auto", "cudnn", "off"
std::optional<FusedAttention> FusedAttentionFromName(std::string_view name);
// Whether a GPU job's device-resident step captures each micro-batch's
// forward and backward in a CUDA graph and replays it (the worker's
// --cuda_graphs; compute/capture_cache.h): kAuto where the backend captures
// (CUDA), falling back to launching op by op where a capture fails; kOff:
// op by op always. The CPU backend captures nothing either way.
enum class CudaGraphs { kAuto, kOff };
const char* CudaGraphsName(CudaGraphs mode);  // "auto", "off"
std::optional<CudaGraphs> CudaGraphsFromName(std::string_view name);
// Whether cuDNN loads on this machine (cuda_cudnn_library.h): OK naming
// nothing, else why not (Unimplemented in a build without CUDA). For the
// worker's start with --fused_attention=cudnn; the backend checks again,
// with the device and the shapes, when a job builds it.
absl::Status CheckCudnnLoads();

struct BackendOptions {
  BackendKind kind = BackendKind::kCpu;
  // CPU: OpenMP and OpenBLAS threads; 0 = omp_get_max_threads(). >= 0.
  int num_threads = 0;
  Precision precision = Precision::kFp32;
  // CUDA: the device index (>= 0), and the device memory reserved up front
  // for the backend's buffers (0: allocated on demand; cuda_backend.h).
  int device_index = 0;
  size_t arena_bytes = 0;
  FusedAttention fused_attention = FusedAttention::kAuto;
};

// A new backend owned by the caller. InvalidArgument for a negative thread
// count or a precision the kind does not compute in (the CPU: fp32 only);
// Unimplemented for a kind this build does not provide (CUDA where nvcc was
// missing); the CUDA backend's own
// errors otherwise (cuda_backend.h: FailedPrecondition without a device).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace cohort::compute
