#include "coordinator/server_flags.h"

#include "absl/strings/str_cat.h"

namespace cohort::coordinator {
namespace {

// Heartbeat periods travel to workers as uint32 milliseconds (Welcome);
// every other duration is kept far below that too.
constexpr absl::Duration kMaxHeartbeat = absl::Hours(1);
constexpr absl::Duration kMaxDeadline = absl::Hours(24 * 7);

}  // namespace

absl::Status CheckTimingFlags(const TimingFlags& f) {
  const absl::Duration ms = absl::Milliseconds(1);
  if (absl::Status s = CheckDuration("heartbeat_interval", f.heartbeat_interval, 10 * ms, kMaxHeartbeat);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDuration("heartbeat_timeout", f.heartbeat_timeout,
                                     f.heartbeat_interval + ms, kMaxHeartbeat);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (it must exceed --heartbeat_interval)"));
  }
  struct Bound {
    const char* flag;
    absl::Duration value, min, max;
  };
  const Bound bounds[] = {
      {"readopt_grace", f.readopt_grace, absl::ZeroDuration(), kMaxDeadline},
      {"suspend_timeout", f.suspend_timeout, ms, kMaxDeadline},
      {"prepare_timeout", f.prepare_timeout, ms, kMaxDeadline},
      {"hang_timeout_floor", f.hang_timeout_floor, absl::ZeroDuration(), kMaxDeadline},
      {"checkpoint_abandon_after", f.checkpoint_abandon_after, absl::Seconds(1), kMaxDeadline},
      {"isolation_limit", f.isolation_limit, absl::ZeroDuration(), kMaxDeadline},
      {"partition_hold", f.partition_hold, absl::Seconds(1), absl::Hours(24)},
  };
  for (const Bound& b : bounds) {
    if (absl::Status s = CheckDuration(b.flag, b.value, b.min, b.max); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace cohort::coordinator
