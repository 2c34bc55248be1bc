#pragma once
// Time behind an interface (docs/conventions.md, Pure core): core logic takes `now` from a Clock;
// tests use FakeClock and advance it by hand instead of sleeping.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cohort {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// Wall clock (absl::Now). Thread-safe, stateless.
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  // Process-wide instance; never destroyed.
  static RealClock* Get();
};

// Manually advanced clock for tests. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000))
      : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort
