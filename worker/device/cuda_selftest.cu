#include <cuda_runtime.h>

#include <vector>

#include "worker/device/cuda_selftest.h"

namespace cohort::worker {
namespace {

constexpr int kElements = 4096;
constexpr float kScale = 3.0f;

__global__ void ScaleAddIndex(const float* x, float* y, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + static_cast<float>(i);
}

// Records the first failing call; returns true if `error` is a failure.
bool Failed(cudaError_t error, const char* call, CudaSelfTestResult* result) {
  if (error == cudaSuccess) return false;
  if (result->error == 0) {
    result->error = static_cast<int>(error);
    result->failed_call = call;
  }
  return true;
}

}  // namespace

CudaSelfTestResult RunCudaSelfTest(int device) {
  CudaSelfTestResult result;
  result.elements = kElements;
  if (Failed(cudaSetDevice(device), "cudaSetDevice", &result)) return result;

  std::vector<float> x(kElements), y(kElements, -1.0f);
  // Small integers: every product and sum is exact in float.
  for (int i = 0; i < kElements; ++i) x[i] = static_cast<float>(i % 97);
  const size_t bytes = kElements * sizeof(float);
  float* device_x = nullptr;
  float* device_y = nullptr;
  if (!Failed(cudaMalloc(&device_x, bytes), "cudaMalloc", &result) &&
      !Failed(cudaMalloc(&device_y, bytes), "cudaMalloc", &result) &&
      !Failed(cudaMemcpy(device_x, x.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy",
              &result)) {
    constexpr int kThreads = 256;
    ScaleAddIndex<<<(kElements + kThreads - 1) / kThreads, kThreads>>>(device_x, device_y, kScale,
                                                                       kElements);
    if (!Failed(cudaGetLastError(), "kernel launch", &result) &&
        !Failed(cudaDeviceSynchronize(), "cudaDeviceSynchronize", &result)) {
      Failed(cudaMemcpy(y.data(), device_y, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", &result);
    }
  }
  if (device_x != nullptr) Failed(cudaFree(device_x), "cudaFree", &result);
  if (device_y != nullptr) Failed(cudaFree(device_y), "cudaFree", &result);
  if (result.error != 0) return result;

  for (int i = 0; i < kElements; ++i) {
    if (y[i] != kScale * x[i] + static_cast<float>(i)) {
      if (result.first_mismatch < 0) result.first_mismatch = i;
      ++result.mismatches;
    }
  }
  return result;
}

}  // namespace cohort::worker
