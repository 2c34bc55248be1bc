#pragma once
// What the device-resident step's tests share (device_resident_step_test,
// captured_step_test): their training config and the bitwise comparisons of
// steps.
//
// Header-only.

#include <cstring>

#include "gtest/gtest.h"
#include "tests/testing/training_configs.h"
#include "worker/train/step_runner.h"
#include "worker/train/training_config.h"

namespace cohort::testing {

inline bool SameBits(const void* a, const void* b, size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

// Three micro-batches per step (the gradient tree folds on the backend),
// clipping and weight decay on; the learning rate changes every step.
inline train::TrainingConfig DeviceResidentConfig(int steps) {
  train::TrainingConfig config = SmallTrainingConfig(6, 2, steps);
  config.grad_clip = 1.0;
  config.adamw.weight_decay = 0.1;
  return config;
}

// Both steps succeeded with the same loss and norm bits.
inline void ExpectSameStep(const absl::StatusOr<train::StepResult>& a,
                           const absl::StatusOr<train::StepResult>& b, int64_t step) {
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  EXPECT_TRUE(SameBits(&a->loss, &b->loss, sizeof(double))) << "loss, step " << step;
  EXPECT_TRUE(SameBits(&a->grad_norm, &b->grad_norm, sizeof(double))) << "norm, step " << step;
}

}  // namespace cohort::testing
