#pragma once
// CPU discovery from std::thread and /proc.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/device/device_info.h"

namespace cohort::worker {

// The host's CPUs as device `index` (several CPU workers may share a host, one
// slot each). InvalidArgument for a negative index; Unavailable if /proc
// gives no memory size.
absl::StatusOr<DeviceInfo> DiscoverCpuDevice(int index);

// MemTotal of a /proc/meminfo text, in bytes; 0 if absent.
int64_t ParseMemTotalBytes(absl::string_view meminfo);
// The first "model name" of a /proc/cpuinfo text; empty if absent (some
// architectures do not report one).
std::string ParseCpuModel(absl::string_view cpuinfo);

}  // namespace cohort::worker
