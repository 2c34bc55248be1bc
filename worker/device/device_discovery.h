#pragma once
// The portable entry point to device discovery: CPU always, GPU where the
// build has CUDA.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cohort/v1/workers.pb.h"
#include "worker/device/device_info.h"

namespace cohort::worker {

// True when this binary was built with CUDA (nvcc present at build time).
bool BuildHasCuda();

// Discovers device `index` of `kind`; for a GPU, also runs the self-test, so
// an OK result is a device that computes. Errors:
//   Unimplemented       GPU requested from a build without CUDA
//   FailedPrecondition  no usable GPU or driver on this host
//   InvalidArgument     bad index or kind
//   Internal            the GPU self-test failed
absl::StatusOr<DeviceInfo> DiscoverDevice(v1::DeviceKind kind, int index);

// The collective transports this build implements for the device (none yet:
// "ucx" and "nccl" arrive with the collectives layer).
std::vector<std::string> TransportsFor(const DeviceInfo& device);

// What the worker announces in its Hello.
v1::Capabilities CapabilitiesFor(const DeviceInfo& device);

// "cpu" or "gpu".
const char* DeviceKindName(v1::DeviceKind kind);

}  // namespace cohort::worker
