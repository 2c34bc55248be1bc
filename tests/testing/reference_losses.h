#pragma once
// The reference trajectory of a job: the loss after every step of one
// TrainingSession running the spec alone, in one process. Header-only, for
// tests that link the training engine (the cohort_testing library does not).

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cohort/v1/job.pb.h"
#include "gtest/gtest.h"
#include "worker/train/training_config.h"
#include "worker/train/training_session.h"

namespace cohort::testing {

// `steps`: only the first that many (the schedule still spans spec.steps()).
inline std::vector<double> ReferenceLosses(const v1::JobSpec& spec, int64_t steps = -1) {
  absl::StatusOr<train::TrainingConfig> config = train::TrainingConfigFromSpec(spec, {});
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return {};
  train::TrainingSessionOptions options;
  options.num_threads = 1;
  absl::StatusOr<std::unique_ptr<train::TrainingSession>> session =
      train::TrainingSession::Create(*config, model::ModelLayout{}, {}, options);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  std::vector<double> losses;
  const int64_t run = steps < 0 ? spec.steps() : std::min(steps, spec.steps());
  for (int64_t s = 0; s < run; ++s) {
    absl::StatusOr<train::StepResult> step = (*session)->RunStep(Step(s));
    EXPECT_TRUE(step.ok()) << step.status();
    losses.push_back(step.ok() ? step->loss : NAN);
  }
  return losses;
}

}  // namespace cohort::testing
