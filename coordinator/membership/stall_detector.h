#pragma once
// StallDetector: stall detection for one job's running generation, apart from
// the job state machine (JobManager asks it, then fences whom it names).
//
// Per member it keeps the last step heard in a heartbeat, since when, and
// whether the member says it waits for peers; it keeps the recent step times
// rank 0 reported. The job is stalled when no member has advanced for
// max(floor, step_multiple x the median step time): a step can legitimately
// take long (a big model, a slow disk), a stall is long relative to the
// job's own steps. The members to blame are those not waiting for peers;
// when every member waits on the others there is nobody to blame.
//
// Pure logic over `now`; not thread-safe (JobManager's caller serialises).

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "common/ids.h"

namespace cohort::coordinator {

class StallDetector {
 public:
  struct Options {
    // Zero or less: detection is off.
    absl::Duration floor = absl::Seconds(30);
    double step_multiple = 20.0;
  };
  struct Stall {
    absl::Duration idle;             // since the last member advanced
    std::vector<std::string> stuck;  // members not waiting for peers, sorted
  };
  // Step times kept for the median.
  static constexpr size_t kStepTimes = 64;

  // A generation took effect: its members all start at `step` as of `now`.
  void Start(const std::vector<WorkerId>& members, int64_t step, absl::Time now);
  void Remove(const WorkerId& member);
  // A member's heartbeat; members not in the generation are ignored.
  void Observe(const WorkerId& member, int64_t step, bool waiting_for_peers, absl::Time now);
  // A step time reported by rank 0 (seconds, > 0).
  void ObserveStepTime(double seconds);
  // The stall as of `now`, if the job is stalled and someone is to blame.
  std::optional<Stall> Check(absl::Time now, const Options& options) const;
  // The coordinator did not run for `gap` up to `now`: that time counts for
  // no member.
  void Discount(absl::Duration gap, absl::Time now);
  bool empty() const { return members_.empty(); }

 private:
  struct Member {
    int64_t step = 0;
    bool waiting = false;
    absl::Time since;  // when `step` was first heard
  };
  absl::flat_hash_map<WorkerId, Member> members_;
  std::deque<double> step_seconds_;
};

}  // namespace cohort::coordinator
