#pragma once
// Exponential backoff with jitter for re-attaching to the coordinator.

#include <cstdint>
#include <random>

#include "absl/time/time.h"

namespace cohort::worker {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(100);
  double multiplier = 2.0;
  absl::Duration max = absl::Seconds(5);
  // The cap while the worker holds an assignment. A restarted coordinator
  // waits --readopt_grace (default 10 s) for the members of running jobs;
  // retrying at least this often, plus the channel's own reconnect backoff
  // (at most 1 s), keeps the worst case near 2.5 s, well inside it.
  absl::Duration max_while_holding = absl::Seconds(1);
  // Each delay is scaled by a uniform factor in [1 - jitter, 1 + jitter], so
  // workers that lost the same coordinator do not all come back at once.
  double jitter = 0.2;
  // 0 seeds from std::random_device; tests pass a fixed seed.
  uint64_t seed = 0;
};

// Not thread-safe: one owner (the agent's run loop).
class Backoff {
 public:
  explicit Backoff(BackoffOptions options);

  // The delay to wait before the next attempt: initial * multiplier^n, capped
  // at max (at max_while_holding when `holding`), then jittered. Advances n.
  absl::Duration Next(bool holding = false);
  // Back to `initial` (after a successful attach).
  void Reset() { base_ = options_.initial; }

 private:
  BackoffOptions options_;
  absl::Duration base_;
  std::mt19937_64 rng_;
};

}  // namespace cohort::worker
