#include "tests/testing/wait.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace cohort::testing {

bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout,
               absl::Duration poll) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(poll, deadline - now));
  }
}

}  // namespace cohort::testing
