#include "worker/device/cuda_device.h"

#include <cuda_runtime.h>

#include <string_view>

#include "absl/strings/str_cat.h"
#include "worker/device/cuda_selftest.h"

namespace cohort::worker {
namespace {

// CUDA codes are converted here, once (docs/conventions.md, Errors).
std::string DescribeCudaError(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), ": ", cudaGetErrorString(error));
}

}  // namespace

absl::StatusOr<DeviceInfo> DiscoverCudaDevice(int index) {
  if (index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--device_index must be >= 0, got ", index));
  }
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // cudaErrorNoDevice, cudaErrorInsufficientDriver and friends: the host
    // has no usable GPU, which the operator fixes, not this process.
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device (", DescribeCudaError(error),
                     "); run with --device cpu or on a host with a GPU and driver"));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device is visible; run with --device cpu or check CUDA_VISIBLE_DEVICES");
  }
  if (index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device_index ", index, " but only ", count, " CUDA device(s) are visible"));
  }
  cudaDeviceProp properties{};
  const cudaError_t props_error = cudaGetDeviceProperties(&properties, index);
  if (props_error != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read properties of CUDA device ",
                                                      index, ": ", DescribeCudaError(props_error)));
  }
  DeviceInfo info;
  info.kind = v1::DEVICE_KIND_GPU;
  info.index = index;
  info.name = properties.name;
  info.memory_bytes = static_cast<int64_t>(properties.totalGlobalMem);
  info.cores = properties.multiProcessorCount;
  info.compute_capability = absl::StrCat(properties.major, ".", properties.minor);
  return info;
}

absl::Status SelfTestCudaDevice(int index) {
  const CudaSelfTestResult result = RunCudaSelfTest(index);
  if (result.error != 0) {
    return absl::InternalError(
        absl::StrCat("GPU self-test on CUDA device ", index, " failed in ", result.failed_call,
                     ": ", DescribeCudaError(static_cast<cudaError_t>(result.error))));
  }
  if (result.mismatches != 0) {
    return absl::InternalError(absl::StrCat(
        "GPU self-test on CUDA device ", index, " computed wrong results: ", result.mismatches,
        " of ", result.elements, " values differ from the host, first at index ",
        result.first_mismatch, "; the device is not usable"));
  }
  return absl::OkStatus();
}

}  // namespace cohort::worker
