#pragma once
// CUDA device discovery and the startup self-test. Built only where nvcc
// exists (COHORT_HAVE_CUDA); device_discovery.h is the portable entry point.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/device_info.h"

namespace cohort::worker {

// Properties of CUDA device `index`. FailedPrecondition when no usable device
// or driver is present (the message names the CUDA error); InvalidArgument
// when `index` is outside the visible devices.
absl::StatusOr<DeviceInfo> DiscoverCudaDevice(int index);

// Runs a small kernel on device `index` and checks its result. Internal, with
// the failing call or the wrong values, when the device does not compute
// correctly.
absl::Status SelfTestCudaDevice(int index);

}  // namespace cohort::worker
