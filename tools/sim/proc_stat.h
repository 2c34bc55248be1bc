#pragma once
// CPU time of another process, from /proc/PID/stat (for measuring the
// coordinator's cost while the simulator loads it).

#include <sys/types.h>

#include <string_view>

#include "absl/status/statusor.h"

namespace cohort::sim {

// utime + stime of a /proc/PID/stat line, in seconds, given the kernel's
// clock ticks per second (sysconf(_SC_CLK_TCK)). The command name may hold
// spaces and parentheses; fields are counted after its last ')'.
// InvalidArgument on a malformed line or ticks_per_second <= 0.
absl::StatusOr<double> ParseProcStatCpuSeconds(std::string_view stat_line, long ticks_per_second);

// Reads /proc/`pid`/stat. NotFound if the process does not exist; errors of
// ParseProcStatCpuSeconds otherwise.
absl::StatusOr<double> ReadProcessCpuSeconds(pid_t pid);

}  // namespace cohort::sim
