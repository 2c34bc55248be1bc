#pragma once
// Which GPUs this build's kernels can run on: the CUDA architectures the
// binary was compiled for (CMAKE_CUDA_ARCHITECTURES, cmake/CohortCuda.cmake)
// against a device's compute capability. Plain host code, compiled in every
// build, so that the decision is tested on machines without a GPU; the CUDA
// backend asks it before it touches a device, and refuses one that no kernel
// image of the binary runs on (a kernel launch there would fail on the first
// op, with cudaErrorNoKernelImageForDevice, instead of at creation).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cohort::compute {

struct ComputeCapability {
  int major = 0;
  int minor = 0;
};

// "8.0", "9.0".
std::string CapabilityName(ComputeCapability capability);

// Whether a binary compiled for `architectures` holds code that a device of
// `device` capability runs. `architectures` is CMake's list, entries split
// by ';' or ',': "90" (machine code for sm_90 and PTX for compute_90, what
// CMake makes of a bare number), "90-real" (machine code only),
// "90-virtual" (PTX only), "90a" (sm_90a's arch-specific machine code) or
// "100f" (the family's machine code). Per NVIDIA's compatibility rules:
// machine code for sm_XY runs on X.Z with Z >= Y, the same major only;
// sm_XYa runs on X.Y alone; sm_XYf on X.Z with Z >= Y; PTX for compute_XY
// is compiled by the driver for any device of capability >= X.Y, later
// majors included. InvalidArgument naming the entry for one that is none
// of these (CMake's "all", "native": cmake/CohortCuda.cmake sets numbers).
absl::StatusOr<bool> HasKernelImageFor(absl::string_view architectures, ComputeCapability device);

// HasKernelImageFor as the CUDA backend's creation answers it: OK when
// `architectures` runs on the device; FailedPrecondition naming the device
// (its index and name), its capability and the architectures built when
// not; Internal for a list HasKernelImageFor cannot read (a build defect).
absl::Status CheckKernelImageFor(absl::string_view architectures, int device_index,
                                 absl::string_view device_name, ComputeCapability capability);

// The architectures this binary's CUDA code was compiled for, as CMake
// listed them with ',' between entries ("80,90"); empty in a build without
// CUDA.
absl::string_view BuiltCudaArchitectures();

}  // namespace cohort::compute
