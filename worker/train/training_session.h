#pragma once
// TrainingSession: everything one rank needs to train one generation of a
// job, built from a TrainingConfig, the rank's ModelLayout and its mesh
// communicators: the compute backend, the model shard (initialised from the
// config's seed in the unsharded layout and sliced, so every layout starts
// from the same weights), the token dataset and sampler, data parallelism
// and the step runner.
//
// Used by the worker's EngineTrainer and by the multi-process training tests
// (tests/train_rank), so both run exactly the same code.
//
// Thread-compatible: one RunStep at a time.

#include <atomic>
#include <memory>
#include <optional>

#include "worker/compute/backend_factory.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/ids.h"
#include "worker/comm/communicator.h"
#include "worker/compute/backend.h"
#include "absl/strings/str_cat.h"
#include "worker/data/batch_sampler.h"
#include "worker/model/initial_weights.h"
#include "worker/data/validation_sampler.h"
#include "worker/data/token_dataset.h"
#include "worker/model/gpt_model.h"
#include "worker/model/model_layout.h"
#include "worker/train/data_parallel.h"
#include "worker/train/step_runner.h"
#include "worker/train/training_config.h"

namespace cohort::train {

class TrainingSession;

struct TrainingSessionOptions {
  // OpenMP threads of the CPU backend and the optimizer; 0 = all cores.
  // Results do not depend on it.
  int num_threads = 0;
  // The CUDA device of a GPU job (TrainingConfig::backend kCuda).
  int device_index = 0;
  // How a CUDA backend runs attention (the worker's --fused_attention).
  compute::FusedAttention fused_attention = compute::FusedAttention::kAuto;
  // Whether the device-resident step replays each micro-batch's forward and
  // backward as a CUDA graph (the worker's --cuda_graphs;
  // StepRunnerOptions::capture_micro_batches).
  compute::CudaGraphs cuda_graphs = compute::CudaGraphs::kAuto;
  // The backend to build the session on instead of creating one from the
  // config (tests: a backend whose memory the host cannot read, to run the
  // GPU path's host staging without a GPU). Null: created.
  std::shared_ptr<compute::Backend> backend;
  // Bound on each collective of a step (a dead peer turns into an error by
  // then at the latest; usually much sooner).
  absl::Duration collective_timeout = absl::Minutes(5);
  // StepRunnerOptions::tie_per_micro_batch (unset: the layout's default).
  std::optional<bool> tie_per_micro_batch;
  // StepRunnerOptions::gradient_observer.
  GradientObserver gradient_observer;
  // StepRunnerOptions::state_versions.
  StateVersionOptions state_versions;
  // Draw the initial weights (config.init_seed) in Create. Off when the
  // caller restores every weight, or calls InitializeParameters once it knows
  // there is nothing to restore: for GPT-2 124M the draw costs 4 s of one
  // core on the 2-core development VM. Without it the optimizer's moments
  // are uninitialised too and no state version is held until a restore
  // (StateVersions::SetCurrent). A model shard taken over from `reuse`
  // keeps its weights (and its moments are left to the restore).
  bool initialize_parameters = true;
  // A session of an older generation of the same job whose parts this one
  // takes over where they fit: the backend (the same precision), the
  // dataset (the same data source) and the sampler (and the same batch); the
  // model shard (weights, gradients, activations) and the gradient
  // accumulation when the model, the layout's shard and the model's
  // capacity are the same too, as on a re-plan that changes only the
  // data-parallel degree. The older session keeps serving its state (the
  // weights are then both sessions'), and must not train while this one
  // exists. An older session that holds no state (a warm spare's, prepared
  // for another place) also lends its moment, previous-version and mirror
  // buffers, and must not be used afterwards. Null: build everything.
  TrainingSession* reuse = nullptr;
  // The job checkpoints: a session whose step runs device-resident also
  // keeps a snapshot of its state in backend memory (DeviceSnapshot: 12
  // bytes per parameter of its update range), so that a checkpoint drains
  // beside the next steps instead of stalling them for the trip to the
  // host. Where the device lacks the room for it, the session is built
  // without it (logged) and checkpoints copy the state synchronously.
  bool checkpoint_snapshot = false;
};

// This rank's communicators, one per mesh axis; each may be null where its
// degree is 1. They must outlive the session.
struct TrainingGroups {
  comm::Communicator* data = nullptr;
  comm::Communicator* tensor = nullptr;
  comm::Communicator* pipeline = nullptr;
};

class TrainingSession {
 public:
  // groups.data has dp ranks (the config's batch split over them); the
  // tensor and pipeline groups match `layout`. Errors: those of
  // LoadDatasets, BatchSampler::Create (e.g. token ids >= vocab),
  // ValidationSampler::Create (too little held-out data),
  // GptModel::Create and StepRunner::Create.
  static absl::StatusOr<std::unique_ptr<TrainingSession>> Create(
      const TrainingConfig& config, const model::ModelLayout& layout, const TrainingGroups& groups,
      const TrainingSessionOptions& options);

  // The memory a session of `config` for `layout` at data rank `dp_rank` of
  // `dp` takes once every buffer exists (Reserve()d): weights, gradients and
  // their accumulation, activations, AdamW moments, ZeRO-1 staging, the
  // previous version and the mirrors; on a GPU job also the host copies the
  // model stages through (so the sum of host and device memory, an upper
  // bound of either). Errors: the backend's.
  static absl::StatusOr<uint64_t> EstimateBytes(const TrainingConfig& config,
                                                const model::ModelLayout& layout, int dp,
                                                int dp_rank, const TrainingSessionOptions& options);

  // The backend memory a session of `config` for `layout` with `dp` data
  // ranks allocates on `backend` (0 on a backend of host memory): the
  // model's buffers and the ops' scratch, and where its step runs
  // device-resident (RunsDeviceResident) the gradient tree, the moments,
  // the norm's buffers, the loss sums, the weights' working copy and with
  // options.checkpoint_snapshot the DeviceSnapshot; each
  // rounded as the device allocator rounds it. Create reserves it at once
  // (Backend::ReserveDeviceMemory). It settles the backend's attention
  // (Backend::ScratchBytes). Errors: the backend's.
  static absl::StatusOr<uint64_t> EstimateDeviceBytes(const TrainingConfig& config,
                                                      const model::ModelLayout& layout, int dp,
                                                      compute::Backend& backend,
                                                      const TrainingSessionOptions& options);
  // Whether a session's step keeps its state in backend memory
  // (StepRunner::device_resident), from what is known before it is built.
  static bool RunsDeviceResident(bool host_memory, int dp, const model::ModelLayout& layout,
                                 const TrainingSessionOptions& options);

  // Allocates and touches now what the first step would (the model's
  // buffers, the moments, the previous version's, the mirrors'): a session
  // prepared ahead then faults in no fresh pages when it trains. It writes
  // zeros over the state, so only a session whose state is restored or
  // initialised afterwards calls it.
  void Reserve() {
    model_->Touch();
    runner_->Reserve();
  }

  // The state of a fresh start: the initial weights drawn from
  // config().init_seed and zero moments (see
  // TrainingSessionOptions::initialize_parameters).
  void InitializeParameters() {
    model_->InitializeParameters(config_.init_seed);
    runner_->ResetOptimizerState();
  }

  // The state of a fresh start from the weights in a safetensors file
  // (checkpoint.init_from; either layout, model/initial_weights.h): this
  // rank's shard of them and zero moments. Errors name the field, the file
  // and the tensor (a shape or name that does not fit the model).
  absl::Status InitializeFromFile(const std::string& path) {
    absl::Status loaded =
        model::LoadInitialWeights(path, config_.model, model_->table(), model_->params());
    if (!loaded.ok()) {
      return absl::Status(loaded.code(), absl::StrCat("checkpoint.init_from: ", loaded.message()));
    }
    runner_->ResetOptimizerState();
    return absl::OkStatus();
  }

  // The device snapshot of TrainingSessionOptions::checkpoint_snapshot;
  // null without one (the host path, no checkpoints, or no room).
  DeviceSnapshot* device_snapshot() const { return snapshot_.get(); }
  // Takes the state's snapshot now (StepRunner::SnapshotState), between
  // steps. FailedPrecondition without device_snapshot().
  absl::Status TakeSnapshot() {
    if (snapshot_ == nullptr) return absl::FailedPreconditionError("the session has no device snapshot");
    return runner_->SnapshotState(*snapshot_);
  }

  // See StepRunner::Run.
  absl::StatusOr<StepResult> RunStep(Step step, const std::atomic<bool>* cancel = nullptr) {
    return runner_->Run(step, cancel);
  }

  // The mean loss over the validation batches (StepRunner::Evaluate); the
  // weights are untouched. FailedPrecondition without validation data.
  absl::StatusOr<double> Validate(const std::atomic<bool>* cancel = nullptr) {
    if (validation_sampler_ == nullptr) {
      return absl::FailedPreconditionError("the job has no data.validation");
    }
    return runner_->Evaluate(*validation_sampler_, cancel);
  }

  // Whether this session trains on the model shard of options.reuse.
  bool reused_model() const { return reused_model_; }
  // Whether a session of `config` for `layout` with `dp` data ranks would
  // train on this one's model shard (TrainingSessionOptions::reuse).
  // The activation slots a model shard needs to serve any data rank of the
  // config's split (its largest share of the step's micro-batches).
  static int ActivationSlotsFor(const TrainingConfig& config, const model::ModelLayout& layout);
  bool ModelFitsFor(const TrainingConfig& config, const model::ModelLayout& layout) const {
    return ModelFits(*this, config, layout, ActivationSlotsFor(config, layout));
  }
  // The data pipeline (shared with the sessions that reused it).
  const data::TokenDataset& dataset() const { return *dataset_; }

  const TrainingConfig& config() const { return config_; }
  model::GptModel& model() { return *model_; }
  const model::GptModel& model() const { return *model_; }
  const DataParallel& data_parallel() const { return *data_parallel_; }
  const data::BatchSampler& sampler() const { return *sampler_; }
  const StepRunner& runner() const { return *runner_; }
  StepRunner& runner() { return *runner_; }

 private:
  explicit TrainingSession(const TrainingConfig& config) : config_(config) {}

  // Whether a session of `config` for `layout` can train on `other`'s
  // model shard (see TrainingSessionOptions::reuse).
  static bool ModelFits(const TrainingSession& other, const TrainingConfig& config,
                        const model::ModelLayout& layout, int activation_slots);
  // Reserves EstimateDeviceBytes on the session's backend before its model
  // allocates: a shortage fails Create with the bytes needed, asked and free.
  // With options.checkpoint_snapshot, a reservation the device refuses is
  // asked again without the snapshot, and `snapshot` says which was made.
  static absl::Status ReserveDeviceMemory(const TrainingConfig& config,
                                          const model::ModelLayout& layout, int dp,
                                          const TrainingSessionOptions& options,
                                          TrainingSession& session, bool* snapshot);

  const TrainingConfig config_;
  // Shared with the sessions of later generations that reuse them
  // (TrainingSessionOptions::reuse); the model before its backend goes.
  std::shared_ptr<compute::Backend> backend_;
  std::shared_ptr<model::GptModel> model_;
  std::shared_ptr<const data::TokenDataset> dataset_;
  std::shared_ptr<data::BatchSampler> sampler_;
  // Null without data.validation.
  std::shared_ptr<const data::TokenDataset> validation_dataset_;
  std::shared_ptr<data::ValidationSampler> validation_sampler_;
  bool reused_model_ = false;
  std::unique_ptr<DataParallel> data_parallel_;
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<DeviceSnapshot> snapshot_;  // before the backend goes
};

}  // namespace cohort::train
