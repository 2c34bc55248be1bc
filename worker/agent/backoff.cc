#include "worker/agent/backoff.h"

#include <algorithm>

namespace cohort::worker {
namespace {

uint64_t SeedOrRandom(uint64_t seed) {
  if (seed != 0) return seed;
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

Backoff::Backoff(BackoffOptions options)
    : options_(options), base_(options.initial), rng_(SeedOrRandom(options.seed)) {}

absl::Duration Backoff::Next(bool holding) {
  const absl::Duration cap =
      holding ? std::min(options_.max, options_.max_while_holding) : options_.max;
  const absl::Duration base = std::min(base_, cap);
  base_ = std::min(base_ * options_.multiplier, options_.max);
  const double jitter = std::clamp(options_.jitter, 0.0, 1.0);
  std::uniform_real_distribution<double> factor(1.0 - jitter, 1.0 + jitter);
  return base * factor(rng_);
}

}  // namespace cohort::worker
