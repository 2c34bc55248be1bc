#pragma once
// Start-up checks of the coordinator's flags (coordinator/main.cc): every
// value is range-checked before anything starts, so a typo is an error
// naming the flag, not a silent wrap (a 32-bit millisecond field), a random
// port or a deadline that never comes.

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/flag_checks.h"  // CheckDuration, CheckHostPort

namespace cohort::coordinator {

// The timing flags together, as main.cc passes them.
struct TimingFlags {
  absl::Duration heartbeat_interval;
  absl::Duration heartbeat_timeout;
  absl::Duration readopt_grace;
  absl::Duration suspend_timeout;
  absl::Duration prepare_timeout;
  absl::Duration hang_timeout_floor;
  absl::Duration checkpoint_abandon_after;
  absl::Duration isolation_limit;
  absl::Duration partition_hold;
};
// The first violated bound, naming its flag and the allowed range.
absl::Status CheckTimingFlags(const TimingFlags& flags);

}  // namespace cohort::coordinator
