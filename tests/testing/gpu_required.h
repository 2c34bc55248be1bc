#pragma once
// How a gpu-labelled test leaves when this machine gives it no GPU to run
// on (no device, no CUDA backend, a build without CUDA): a skip, naming the
// reason, on the development machines; a failure, naming the same reason,
// where COHORT_GPU_REQUIRED=1 says a GPU is there. tools/gpu-check sets it
// when `nvidia-smi -L` lists a GPU, so a device run whose backend cannot be
// created (a driver too old for the toolkit, a missing library, a cuBLASLt
// failure) fails instead of reporting every GPU case skipped as a success.
//
// Only for "this machine has no usable GPU". The inverse checks (a test of
// the no-GPU error path, skipped where a GPU exists) and tests that need
// more devices than the host has (NCCL's two-rank cases on a one-GPU
// machine) stay plain GTEST_SKIPs with their reason.
//
//   if (!backend.ok()) COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no CUDA backend here: " +
//   backend.status().ToString());
//
// Like GTEST_SKIP and GTEST_FAIL it returns from the calling function, so it
// belongs in a TEST body or a fixture's SetUp.

#include <cstdlib>
#include <string_view>

#include "gtest/gtest.h"

namespace cohort::testing {

// COHORT_GPU_REQUIRED=1 in the environment; any other value or none is
// false, so a stray empty or "0" setting keeps the development default.
inline bool GpuRequired() {
  const char* value = std::getenv("COHORT_GPU_REQUIRED");
  return value != nullptr && std::string_view(value) == "1";
}

}  // namespace cohort::testing

#define COHORT_SKIP_OR_FAIL_WITHOUT_GPU(reason)                                                    \
  do {                                                                                             \
    if (::cohort::testing::GpuRequired()) {                                                        \
      GTEST_FAIL()                                                                                 \
          << "COHORT_GPU_REQUIRED=1 (tools/gpu-check: nvidia-smi lists a GPU), yet this test has " \
             "none to run on: "                                                                    \
          << (reason);                                                                             \
    }                                                                                              \
    GTEST_SKIP() << (reason);                                                                      \
  } while (0)
