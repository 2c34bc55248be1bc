#pragma once
// TrainingSession: everything one rank needs to train one generation of a
// job, built from a TrainingConfig and its data-group communicator: the
// compute backend, the model (initialised from the config's seed in the
// unsharded layout, so every rank starts from the same weights), the token
// dataset and sampler, data parallelism and the step runner.
//
// Used by the worker's EngineTrainer and by the multi-process training tests
// (tests/train_rank), so both run exactly the same code.
//
// Thread-compatible: one RunStep at a time.

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/ids.h"
#include "worker/comm/communicator.h"
#include "worker/compute/backend.h"
#include "worker/data/batch_sampler.h"
#include "worker/data/token_dataset.h"
#include "worker/model/gpt_model.h"
#include "worker/train/data_parallel.h"
#include "worker/train/step_runner.h"
#include "worker/train/training_config.h"

namespace cohort::train {

struct TrainingSessionOptions {
  // OpenMP threads of the CPU backend and the optimizer; 0 = all cores.
  // Results do not depend on it.
  int num_threads = 0;
  // Bound on each collective of a step (a dead peer turns into an error by
  // then at the latest; usually much sooner).
  absl::Duration collective_timeout = absl::Minutes(5);
};

class TrainingSession {
 public:
  // `data_group` may be null for a single replica; it must outlive the
  // session and have `dp` ranks matching the config's batch split. Errors:
  // those of LoadDataset, BatchSampler::Create (e.g. token ids >= vocab),
  // GptModel::Create and StepRunner::Create.
  static absl::StatusOr<std::unique_ptr<TrainingSession>> Create(
      const TrainingConfig& config, comm::Communicator* data_group,
      const TrainingSessionOptions& options);

  // See StepRunner::Run.
  absl::StatusOr<StepResult> RunStep(Step step) { return runner_->Run(step); }

  const TrainingConfig& config() const { return config_; }
  model::GptModel& model() { return *model_; }
  const DataParallel& data_parallel() const { return *data_parallel_; }

 private:
  explicit TrainingSession(const TrainingConfig& config) : config_(config) {}

  const TrainingConfig config_;
  std::unique_ptr<compute::Backend> backend_;
  std::unique_ptr<model::GptModel> model_;
  std::unique_ptr<data::TokenDataset> dataset_;
  std::unique_ptr<data::BatchSampler> sampler_;
  std::unique_ptr<DataParallel> data_parallel_;
  std::unique_ptr<StepRunner> runner_;
};

}  // namespace cohort::train
