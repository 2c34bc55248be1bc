#pragma once
// Facts about this process and host.

#include <cstdint>
#include <string>

#include "common/ids.h"

namespace cohort {

// A fresh random non-zero incarnation for this process start.
Incarnation NewIncarnation();
// gethostname(), or "localhost" if it fails.
std::string HostName();
// Resident set size of this process in bytes (0 if /proc is unreadable).
int64_t ResidentMemoryBytes();
// CPU seconds (user + system) this process has used.
double ProcessCpuSeconds();

}  // namespace cohort
