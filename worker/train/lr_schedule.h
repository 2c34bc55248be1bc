#pragma once
// The learning-rate schedule: linear warmup, then cosine decay to min_lr
// (llm.c's and nanoGPT's schedule). For a 0-based step s:
//
//   s <  warmup:           lr = max_lr * (s + 1) / warmup
//   warmup <= s < total:   r  = (s - warmup) / (total - warmup)        in [0, 1)
//                          lr = min_lr + 0.5 * (1 + cos(pi * r)) * (max_lr - min_lr)
//   s >= total:            lr = min_lr
//
// So step 0 already trains (at max_lr / warmup), the peak max_lr is reached at
// s = warmup, and with warmup = 0 the cosine starts at s = 0. Evaluated in
// double.

#include <cstdint>

#include "absl/status/status.h"

namespace cohort::train {

struct LrScheduleOptions {
  double max_lr = 0.0;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
};

// OK, or InvalidArgument naming the field: max_lr >= 0, 0 <= min_lr <= max_lr,
// warmup_steps >= 0, total_steps >= 1.
absl::Status ValidateLrSchedule(const LrScheduleOptions& options);

// The learning rate for 0-based `step` (>= 0); options must be valid.
double LearningRate(const LrScheduleOptions& options, int64_t step);

}  // namespace cohort::train
