#pragma once
// What a worker learns about the device it runs on.

#include <cstdint>
#include <string>

#include "cohort/v1/job.pb.h"

namespace cohort::worker {

struct DeviceInfo {
  v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
  int index = 0;                   // --device_index: a CUDA ordinal, or a CPU slot
  std::string name;                // CPU model or GPU product name
  int64_t memory_bytes = 0;        // host memory (CPU) or device memory (GPU)
  int cores = 0;                   // logical CPUs (CPU) or streaming multiprocessors (GPU)
  std::string compute_capability;  // "9.0" for a GPU; empty for a CPU
};

}  // namespace cohort::worker
