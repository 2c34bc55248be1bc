#pragma once
// EventQueue: the simulator's one source of time. Events run in (time,
// insertion order); the fake clock is set to each event's time before it
// runs, so the coordinator core and the simulated workers see one timeline.
// Not thread-safe: the simulation is single-threaded by design (the same
// seed must replay the same run).

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"

namespace cohort::simulation {

class EventQueue {
 public:
  explicit EventQueue(FakeClock* clock) : clock_(clock) {}

  absl::Time Now() const { return clock_->Now(); }

  // Runs `fn` at `at` (never earlier than now).
  void At(absl::Time at, std::function<void()> fn) {
    if (at < Now()) at = Now();
    events_.push(Event{at, next_sequence_++, std::move(fn)});
  }
  void After(absl::Duration delay, std::function<void()> fn) { At(Now() + delay, std::move(fn)); }

  // Runs the next event if it is due by `limit`; false when none is.
  bool RunNext(absl::Time limit) {
    if (events_.empty() || events_.top().at > limit) return false;
    Event event = events_.top();
    events_.pop();
    clock_->Set(event.at);
    ++executed_;
    event.fn();
    return true;
  }

  uint64_t executed() const { return executed_; }

 private:
  struct Event {
    absl::Time at;
    uint64_t sequence;
    std::function<void()> fn;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.at != b.at ? a.at > b.at : a.sequence > b.sequence;
    }
  };

  FakeClock* clock_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  uint64_t next_sequence_ = 0;
  uint64_t executed_ = 0;
};

}  // namespace cohort::simulation
