#pragma once
// Bounded polling for conditions that become true in another process or
// thread. Every wait in a test has a timeout (never a bare sleep).

#include <functional>

#include "absl/time/time.h"

namespace cohort::testing {

// Calls `condition` every `poll` until it returns true (-> true) or `timeout`
// has passed (-> false; the condition is checked once more at the deadline).
bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout,
               absl::Duration poll = absl::Milliseconds(10));

}  // namespace cohort::testing
