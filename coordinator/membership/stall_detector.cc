#include "coordinator/membership/stall_detector.h"

#include <algorithm>

namespace cohort::coordinator {

void StallDetector::Start(const std::vector<WorkerId>& members, int64_t step, absl::Time now) {
  members_.clear();
  for (const WorkerId& member : members) members_[member] = Member{step, false, now};
}

void StallDetector::Remove(const WorkerId& member) { members_.erase(member); }

void StallDetector::Observe(const WorkerId& member, int64_t step, bool waiting_for_peers,
                            absl::Time now) {
  auto it = members_.find(member);
  if (it == members_.end()) return;
  it->second.waiting = waiting_for_peers;
  if (step != it->second.step) {
    it->second.step = step;
    it->second.since = now;
  }
}

void StallDetector::ObserveStepTime(double seconds) {
  if (!(seconds > 0)) return;
  step_seconds_.push_back(seconds);
  if (step_seconds_.size() > kStepTimes) step_seconds_.pop_front();
}

std::optional<StallDetector::Stall> StallDetector::Check(absl::Time now,
                                                          const Options& options) const {
  if (options.floor <= absl::ZeroDuration() || members_.empty()) return std::nullopt;
  absl::Time last_advance = absl::InfinitePast();
  for (const auto& [worker, m] : members_) last_advance = std::max(last_advance, m.since);
  absl::Duration timeout = options.floor;
  if (!step_seconds_.empty()) {
    std::vector<double> sorted(step_seconds_.begin(), step_seconds_.end());
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    timeout = std::max(timeout, absl::Seconds(options.step_multiple * sorted[sorted.size() / 2]));
  }
  if (now - last_advance < timeout) return std::nullopt;
  Stall stall{now - last_advance, {}};
  for (const auto& [worker, m] : members_) {
    if (!m.waiting) stall.stuck.push_back(worker.value());
  }
  if (stall.stuck.empty()) return std::nullopt;
  std::sort(stall.stuck.begin(), stall.stuck.end());
  return stall;
}

void StallDetector::Discount(absl::Duration gap, absl::Time now) {
  for (auto& [worker, m] : members_) m.since = std::min(m.since + gap, now);
}

}  // namespace cohort::coordinator
