#include "worker/compute/gpu_architectures.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

// The build's list, from CMake (worker/CMakeLists.txt); none without CUDA.
#ifndef COHORT_CUDA_ARCHITECTURES
#define COHORT_CUDA_ARCHITECTURES ""
#endif

namespace cohort::compute {
namespace {

// What one CMake entry puts into the binary.
struct ArchitectureEntry {
  ComputeCapability target;
  bool machine_code = true;    // SASS for sm_XY (or sm_XYa, sm_XYf)
  bool ptx = true;             // PTX for compute_XY
  bool arch_specific = false;  // "a": runs on X.Y alone
  bool family = false;         // "f": runs on X.Z, Z >= Y, the same major
};

absl::StatusOr<ArchitectureEntry> ParseEntry(absl::string_view text) {
  ArchitectureEntry entry;
  absl::string_view number = text;
  if (absl::ConsumeSuffix(&number, "-real")) {
    entry.ptx = false;
  } else if (absl::ConsumeSuffix(&number, "-virtual")) {
    entry.machine_code = false;
  }
  if (absl::ConsumeSuffix(&number, "a")) {
    entry.arch_specific = true;
  } else if (absl::ConsumeSuffix(&number, "f")) {
    entry.family = true;
  }
  int value = 0;
  if (number.empty() || !std::isdigit(static_cast<unsigned char>(number.front())) ||
      !absl::SimpleAtoi(number, &value) || value < 10) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA architecture entry \"", text,
        "\" is not a number with an optional a/f and -real/-virtual suffix (\"80\", \"90a\", "
        "\"90-virtual\")"));
  }
  entry.target = ComputeCapability{.major = value / 10, .minor = value % 10};
  return entry;
}

bool Runs(const ArchitectureEntry& entry, ComputeCapability device) {
  const ComputeCapability& target = entry.target;
  const bool same_major_and_minor_at_least =
      device.major == target.major && device.minor >= target.minor;
  // "a" and "f" bind their PTX as they bind their machine code.
  if (entry.arch_specific) return device.major == target.major && device.minor == target.minor;
  if (entry.family) return same_major_and_minor_at_least;
  // Machine code runs within its major; the driver compiles PTX at load
  // time for any later device, later majors too.
  const bool at_least = device.major > target.major || same_major_and_minor_at_least;
  return (entry.machine_code && same_major_and_minor_at_least) || (entry.ptx && at_least);
}

}  // namespace

std::string CapabilityName(ComputeCapability capability) {
  return absl::StrCat(capability.major, ".", capability.minor);
}

absl::StatusOr<bool> HasKernelImageFor(absl::string_view architectures, ComputeCapability device) {
  bool runs = false;
  for (absl::string_view text : absl::StrSplit(architectures, absl::ByAnyChar(",;"))) {
    text = absl::StripAsciiWhitespace(text);
    if (text.empty()) continue;
    absl::StatusOr<ArchitectureEntry> entry = ParseEntry(text);
    if (!entry.ok()) return entry.status();
    // Every entry is parsed, so that a bad list is refused whatever the
    // device.
    runs = runs || Runs(*entry, device);
  }
  return runs;
}

absl::Status CheckKernelImageFor(absl::string_view architectures, int device_index,
                                 absl::string_view device_name, ComputeCapability capability) {
  absl::StatusOr<bool> runs = HasKernelImageFor(architectures, capability);
  if (!runs.ok()) {
    return absl::InternalError(
        absl::StrCat("this build's CUDA architecture list: ", runs.status().message()));
  }
  if (*runs) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA device ", device_index, " (", device_name, ") has compute capability ",
                   CapabilityName(capability),
                   ", and this build's kernels are for CUDA architectures ", architectures,
                   " only: none of them runs on it (build with its architecture in "
                   "CMAKE_CUDA_ARCHITECTURES, cmake/CohortCuda.cmake, or use another device)"));
}

absl::string_view BuiltCudaArchitectures() { return COHORT_CUDA_ARCHITECTURES; }

}  // namespace cohort::compute
