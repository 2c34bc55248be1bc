#pragma once
// A tiny kernel run on the chosen GPU at startup, so a worker with a broken
// device refuses to start instead of failing mid-job. Plain C++ (no Abseil)
// because nvcc compiles the implementation; cuda_device.cc turns the result
// into an absl::Status.

#include <cstdint>

namespace cohort::worker {

struct CudaSelfTestResult {
  int error = 0;                 // a cudaError_t; 0 (cudaSuccess) when every call worked
  const char* failed_call = "";  // the CUDA call that returned `error`
  int64_t elements = 0;          // values computed
  int64_t mismatches = 0;        // values that differ from the host's
  int64_t first_mismatch = -1;   // index of the first wrong value
};

// Runs y[i] = a * x[i] + i over a few thousand elements on `device` and
// compares with the host. Leaves the current device set to `device`.
CudaSelfTestResult RunCudaSelfTest(int device);

}  // namespace cohort::worker
