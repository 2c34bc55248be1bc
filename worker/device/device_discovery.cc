#include "worker/device/device_discovery.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/device/cpu_device.h"
#if COHORT_HAVE_CUDA
#include "worker/device/cuda_device.h"
#endif

namespace cohort::worker {

bool BuildHasCuda() {
#if COHORT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<DeviceInfo> DiscoverDevice(v1::DeviceKind kind, int index) {
  switch (kind) {
    case v1::DEVICE_KIND_CPU:
      return DiscoverCpuDevice(index);
    case v1::DEVICE_KIND_GPU: {
#if COHORT_HAVE_CUDA
      ASSIGN_OR_RETURN(DeviceInfo info, DiscoverCudaDevice(index));
      RETURN_IF_ERROR(SelfTestCudaDevice(index));
      return info;
#else
      return absl::UnimplementedError(
          "--device gpu: this build has no CUDA support (nvcc was not found when it was "
          "built); use --device cpu or rebuild on a host with the CUDA toolkit");
#endif
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown device kind ", static_cast<int>(kind)));
  }
}

std::vector<std::string> TransportsFor(const DeviceInfo& device) {
  // Only transports this build implements are announced; the UCX and NCCL
  // communicators land with the collectives issue.
  return {};
}

v1::Capabilities CapabilitiesFor(const DeviceInfo& device) {
  v1::Capabilities capabilities;
  // A GPU worker still drives host threads (data loading, UCX progress).
  capabilities.set_cpu_cores(
      device.kind == v1::DEVICE_KIND_CPU
          ? device.cores
          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  capabilities.set_memory_bytes(device.memory_bytes);
  capabilities.set_device_name(device.name);
  for (const std::string& transport : TransportsFor(device)) {
    capabilities.add_transports(transport);
  }
  return capabilities;
}

const char* DeviceKindName(v1::DeviceKind kind) {
  switch (kind) {
    case v1::DEVICE_KIND_CPU:
      return "cpu";
    case v1::DEVICE_KIND_GPU:
      return "gpu";
    default:
      return "unspecified";
  }
}

}  // namespace cohort::worker
