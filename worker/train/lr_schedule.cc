#include "worker/train/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace cohort::train {

absl::Status ValidateLrSchedule(const LrScheduleOptions& options) {
  if (!(options.max_lr >= 0.0) || !std::isfinite(options.max_lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LrScheduleOptions.max_lr must be finite and >= 0, got ", options.max_lr));
  }
  if (!(options.min_lr >= 0.0 && options.min_lr <= options.max_lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LrScheduleOptions.min_lr must be in [0, max_lr=", options.max_lr, "], got ",
                     options.min_lr));
  }
  if (options.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LrScheduleOptions.warmup_steps must be >= 0, got ", options.warmup_steps));
  }
  if (options.total_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LrScheduleOptions.total_steps must be >= 1, got ", options.total_steps));
  }
  return absl::OkStatus();
}

double LearningRate(const LrScheduleOptions& options, int64_t step) {
  if (step < options.warmup_steps) {
    return options.max_lr * static_cast<double>(step + 1) /
           static_cast<double>(options.warmup_steps);
  }
  if (step >= options.total_steps) return options.min_lr;
  const double ratio = static_cast<double>(step - options.warmup_steps) /
                       static_cast<double>(options.total_steps - options.warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return options.min_lr + coeff * (options.max_lr - options.min_lr);
}

}  // namespace cohort::train
