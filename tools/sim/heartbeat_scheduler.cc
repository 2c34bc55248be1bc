#include "tools/sim/heartbeat_scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace cohort::sim {

absl::Duration PhaseOffset(int index, int count, absl::Duration interval) {
  if (count <= 0) return absl::ZeroDuration();
  return interval * index / count;
}

HeartbeatScheduler::HeartbeatScheduler(Options options, std::function<void(int index)> send)
    : options_(options), send_(std::move(send)) {}

HeartbeatScheduler::~HeartbeatScheduler() { Stop(); }

void HeartbeatScheduler::Start() {
  const absl::Time start = absl::Now();
  thread_count_ = std::max(1, std::min(options_.threads, options_.count));
  for (int t = 0; t < thread_count_ && options_.count > 0; ++t) {
    threads_.emplace_back([this, t, start] { Run(t, start); });
  }
}

void HeartbeatScheduler::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

void HeartbeatScheduler::Run(int thread_index, absl::Time start) {
  for (int64_t round = 0;; ++round) {
    const absl::Time round_start = start + options_.interval * round;
    for (int i = thread_index; i < options_.count; i += thread_count_) {
      const absl::Time due = round_start + PhaseOffset(i, options_.count, options_.interval);
      const absl::Duration wait = due - absl::Now();
      if (wait > absl::ZeroDuration()) {
        if (stop_.WaitForNotificationWithTimeout(wait)) return;
      } else if (stop_.HasBeenNotified()) {
        return;
      }
      send_(i);
    }
  }
}

}  // namespace cohort::sim
