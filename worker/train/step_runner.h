#pragma once
// StepRunner: one optimizer step on this rank, in any (dp, tp, pp) layout.
//
//   for each op of this stage's 1F1B schedule (pipeline_schedule.h; with one
//   stage simply F0 B0 F1 B1 ...):
//     forward i:  receive the previous stage's activations (stages > 0),
//                 run the stage, hand the output to the next stage
//     backward i: receive the next stage's gradient (stages but the last),
//                 grads = d(mean loss of i / micro_batches_per_step)/d(params)
//                 into zeroed buffers, hand the input gradient back,
//                 fold grads into the rank's reduction tree (GradientTree)
//   sum the tree over the data group    (DataParallel, ZeRO-1 or not)
//   tie the two wte gradient parts (see below)
//   clip by the global norm over unique parameters (GradNormPlan),
//   AdamW on the own range, gather parameters
//
// Point to point. A send is held back until the next op's receive and then
// both go out as one SendRecv (Megatron's send_forward_recv_backward and
// send_backward_recv_forward), so neighbouring stages that send to each
// other at once cannot deadlock; a send with no receive after it goes alone.
// Micro-batch i keeps its activations in slot i % slots (1F1B keeps at most
// p - stage in flight, consecutive ones).
//
// Determinism. The step's micro-batches are the leaves of one fixed
// reduction tree (reduction_tree.h); data rank r holds the contiguous
// leaves DataParallel::leaf_range() and its micro-batch i is the step's
// micro-batch range.begin + i, whose samples come from the sampler's (seed,
// step) alone (the determinism contract). Backwards run in ascending
// micro-batch order on every stage; each gradient is folded into the tree
// as it arrives, and the deterministic data-parallel reduction combines the
// ranks' nodes in the same tree, so the summed gradient, the loss (a tree
// over the per-micro-batch losses) and hence the whole trajectory have the
// same bits for any data-parallel degree and split (tp and pp fixed).
//
// The tied wte has two gradient parts, the LM head's h_i and the token
// embedding's e_i. Without pipeline parallelism (tie_per_micro_batch, the
// default) each leaf is h_i + e_i. With it the parts live on different
// stages: the first stage's leaf holds e_i in the wte slot (its head part is
// zero, and 0 + e is exact), the last stage's h_i; each stage's data group
// sums its part, and then the two end stages exchange their sums and each
// adds the other's (a + b == b + a bitwise). A pipeline run is therefore
// bitwise equal to a single process that sets tie_per_micro_batch = false,
// which keeps the embedding parts in a tree of their own and adds the two
// roots at the end.
//
// Thread-compatible: one Run at a time.

#include <cstdint>
#include <functional>
#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/ids.h"
#include "worker/comm/communicator.h"
#include "worker/data/batch_sampler.h"
#include "worker/data/validation_sampler.h"
#include "worker/model/gpt_model.h"
#include "worker/train/adamw.h"
#include "worker/train/data_parallel.h"
#include "worker/train/device_optimizer.h"
#include "worker/train/device_snapshot.h"
#include "worker/train/grad_norm_plan.h"
#include "worker/train/gradient_tree.h"
#include "worker/train/pipeline_schedule.h"
#include "worker/train/state_versions.h"
#include "worker/train/uninitialized_array.h"
#include "worker/train/training_config.h"

namespace cohort::train {

struct StepResult {
  double loss = 0;       // mean over every token of the global batch
  double grad_norm = 0;  // global L2 norm before clipping
  double learning_rate = 0;
  int64_t tokens = 0;  // tokens of the global batch
};

using GradientObserver =
    std::function<void(const float* grads, size_t n, size_t begin, size_t end, Step step)>;

struct StepRunnerOptions {
  int num_threads = 0;  // OpenMP threads of the optimizer and the norm; 0 = all
  // The model's tensor group (layout.tp ranks) and this rank's pipeline group
  // (layout.pp ranks, group rank == stage); each may be null when its degree
  // is 1, and must outlive the runner.
  comm::Communicator* tensor_group = nullptr;
  comm::Communicator* pipeline_group = nullptr;
  absl::Duration timeout = absl::Minutes(5);  // bound on each point-to-point call
  // How the tied wte's parts are added (see above); unset: per micro-batch
  // without pipeline parallelism, once per step with it (which it requires).
  // False without pipeline parallelism is a single-process reference: it
  // needs one data rank under the deterministic reduction.
  std::optional<bool> tie_per_micro_batch;
  // What the rank keeps for peer recovery (state_versions.h).
  StateVersionOptions state_versions;
  // Called (if set) with the summed gradient of each step before clipping:
  // the model's num_params floats, valid in [begin, end) (the own ZeRO-1
  // shard, or everything). For tests and debugging.
  GradientObserver gradient_observer;
  // The device-resident step runs each micro-batch's forward and backward
  // as one captured unit where the backend captures (a CUDA graph:
  // GptModel::TrainMicroBatch, compute/capture_cache.h); false issues every
  // op on its own (the worker's --cuda_graphs=off).
  bool capture_micro_batches = true;
};

class StepRunner {
 public:
  // Every pointer must outlive the runner. Errors: InvalidArgument when the
  // batch's micro-batches do not match the data group's (DataParallel's
  // micro_batches and shares; the transport's reduction needs them even),
  // a micro-batch exceeds the model's capacity,
  // the pipeline micro-batches exceed the model's activation slots, a group
  // is missing or mis-sized, or tie_per_micro_batch is set with pp > 1.
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(const TrainingConfig& config,
                                                            model::GptModel* model,
                                                            const data::BatchSampler* sampler,
                                                            DataParallel* data_parallel,
                                                            const StepRunnerOptions& options);

  // Activation slots the model needs for `micro_batches` per rank on this
  // stage under 1F1B: min(micro_batches, pp - stage).
  static int ActivationSlots(const model::ModelLayout& layout, int micro_batches);

  // Runs optimizer step `step` (0-based; AdamW's update number step + 1).
  // Errors: the sampler's and the model's; the communicators' (Unavailable,
  // DeadlineExceeded, Aborted: the generation is over); FailedPrecondition
  // for a non-finite loss or gradient norm (parameters are left unchanged).
  // Once `*cancel` (may be null) is true the step returns Aborted before its
  // next micro-batch pass or layer; it is checked only before the step's
  // end phase, so a cancelled step leaves the state as it was.
  absl::StatusOr<StepResult> Run(Step step, const std::atomic<bool>* cancel = nullptr);

  // The mean loss of the model over `sampler`'s validation batches: each
  // batch's micro-batches are split over the data group as a step's are and
  // run forward through the pipeline (no backward, no update), and the
  // per-micro-batch losses are added in the step's reduction tree, so the
  // result has the same bits for any data-parallel degree and is the same
  // on every rank. Errors: the sampler's, the model's and the groups' (as
  // Run); Aborted once `*cancel` is true.
  absl::StatusOr<double> Evaluate(const data::ValidationSampler& sampler,
                                  const std::atomic<bool>* cancel = nullptr);

  // The state of a fresh start: zero moments, and the current buffers
  // (with the model's initial weights) hold step 0. Until this or a restore
  // (then StateVersions::SetCurrent), the moments are uninitialised and no
  // version is held.
  void ResetOptimizerState();
  // The rank's consistent versions (current and previous) and mirrors.
  StateVersions& versions() { return *versions_; }
  const StateVersions& versions() const { return *versions_; }
  // Touches now the buffers a step writes before reading (the gradient
  // accumulation, the previous version) and the moments, writing zeros: see
  // TrainingSession::Reserve.
  void Reserve();
  // Takes `other`'s scratch buffers (the gradient trees) where they
  // are large enough: a runner built on the model shard `other` trained on
  // (a re-plan that changed only the data-parallel degree) then writes into
  // pages already in memory. `other` allocates them again should it run.
  void TakeScratchOf(StepRunner& other);
  // Also takes `other`'s state buffers (moments, previous version, mirrors)
  // where large enough: `other` holds no state (a warm spare's session for
  // another place, about to be released) and is not used afterwards.
  void TakeStateBuffersOf(StepRunner& other);
  // Makes the weights whole from every data rank's shard of them (ZeRO-1;
  // a no-op otherwise), as at the end of a step: after a restore in which
  // each data rank loaded only its own shard. The data group's errors.
  absl::Status GatherParameters() {
    return data_parallel_->GatherParameters(model_->params());
  }
  // AdamW's first and second moments of the own update range
  // [data_parallel.update_begin(), update_end()): what checkpoints save and
  // restore.
  // With the device-resident step they are host copies of the moments in
  // backend memory: a read downloads them if a step changed them since, and
  // the non-const forms (for writing: a restore) have the next step upload
  // them first.
  float* adam_m() { return WritableMoments(m_); }
  float* adam_v() { return WritableMoments(v_); }
  const float* adam_m() const { return ReadableMoments(m_); }
  const float* adam_v() const { return ReadableMoments(v_); }
  // The device-resident step's captured units (null elsewhere).
  const compute::CaptureCache* micro_batch_graphs() const { return graphs_.get(); }
  // Whether the step's end runs on the backend, the training state staying
  // in its memory (step_runner_device.cc): a backend whose memory the host
  // cannot read (a GPU), one rank holding the whole model (dp = tp = pp = 1),
  // no previous version kept and the tied embedding added per micro-batch.
  // Elsewhere the host-staged path runs (gpt_model.h, Memory).
  bool device_resident() const { return device_optimizer_ != nullptr; }
  // The elements [update_begin, update_end) of the weights and the moments
  // into `snapshot`, taken in backend memory after the last step's update
  // and drained to the host beside the next steps (device_snapshot.h): a
  // checkpoint without the state's trip to the host in its stall. State a
  // restore wrote on the host goes to the backend first. FailedPrecondition
  // without the device-resident step; the snapshot's and the backend's errors.
  absl::Status SnapshotState(DeviceSnapshot& snapshot);

  // Time of the last Run spent inside point-to-point calls and waiting
  // for the pipeline (for the benchmark's communication share).
  absl::Duration last_pipeline_wait() const { return last_pipeline_wait_; }

 private:
  struct PendingSend {
    const void* data = nullptr;
    size_t bytes = 0;
    int peer = -1;
  };

  StepRunner(const TrainingConfig& config, model::GptModel* model,
             const data::BatchSampler* sampler, DataParallel* data_parallel,
             const StepRunnerOptions& options, std::vector<PipelineOp> schedule);

  // Receives `bytes` from `peer` into `data`, sending the pending message in
  // the same call if there is one; or just flushes the pending send.
  absl::Status Exchange(void* data, size_t bytes, int peer);
  absl::Status FlushSend();
  absl::Status RunSchedule(Step step, const std::atomic<bool>* cancel);
  // Sums the trees over the data group; returns the summed gradient.
  absl::StatusOr<float*> ReduceOverData();
  // Sums the step's loss over the data and pipeline groups.
  absl::StatusOr<double> StepLoss();
  // Completes the tied wte gradient in `reduced[wte]`: adds the embedding
  // tree's root (tie_per_micro_batch false, one stage), or exchanges the
  // parts between the end stages of a pipeline and adds the other's.
  absl::Status TieEmbedding(float* reduced);
  absl::StatusOr<double> GlobalNorm(const float* accumulated);
  // A finished step's result.
  StepResult ResultOf(double loss, double norm, double lr) const;

  // The device-resident step (step_runner_device.cc). Whether this runner
  // qualifies (see device_resident()), and its setup: the gradient trees in
  // backend memory and the DeviceOptimizer.
  bool QualifiesForDevice() const;
  absl::Status PrepareDevice();
  // Micro-batch `i`'s token arrays in step_tokens_.
  void DeviceTokens(int i, int32_t** inputs, int32_t** targets);
  // Micro-batch `i`'s forward and backward in activation slot `slot`, its
  // tokens `inputs` and `targets` (DeviceTokens), as one captured unit
  // (GptModel::TrainMicroBatch).
  absl::Status TrainMicroBatchOnDevice(int i, int slot, const int32_t* inputs,
                                       const int32_t* targets, double loss_scale);
  // Folds micro-batch `leaf`'s gradients (backend memory) into the tree.
  void AddLeafOnDevice(int leaf, bool kept);
  // The end of a step on the backend: norm, clip and AdamW, the host reading
  // the norm once.
  absl::StatusOr<StepResult> FinishOnDevice(Step step);
  // Where the moments' newest values are, with a device optimizer.
  enum class MomentsNewest { kSynced, kHostNewer, kBackendNewer };
  void SyncMomentsToHost() const;
  void UploadMomentsIfHostNewer();
  // The host copy of m_ or v_, refreshed from the device optimizer's if
  // a step changed it; the writable form marks it newer than the device's.
  float* WritableMoments(UninitializedArray<float>& moments);
  const float* ReadableMoments(const UninitializedArray<float>& moments) const;

  const TrainingConfig config_;
  model::GptModel* const model_;
  const data::BatchSampler* const sampler_;
  DataParallel* const data_parallel_;
  const StepRunnerOptions options_;
  const model::ModelLayout layout_;
  const std::vector<PipelineOp> schedule_;
  const LeafRange leaves_;  // this rank's micro-batches, as leaves of the step's tree
  const int micro_batches_per_rank_;
  const int slots_;
  const bool tie_per_micro_batch_;
  const GradNormPlan norm_plan_;
  std::vector<int32_t> inputs_;
  std::vector<int32_t> targets_;
  GradientTree tree_;  // the gradients of this rank's micro-batches
  // The token embedding's wte part, when it is added once per step on one
  // stage (tie_per_micro_batch false without a pipeline).
  std::optional<GradientTree> embedding_tree_;
  std::vector<double> leaf_losses_;  // the step's per-micro-batch losses (last stage: own)
  std::vector<char> send_buffer_;       // an input gradient waiting to be sent
  std::vector<float> tie_buffer_;       // the other end stage's wte gradient
  std::vector<double> norm_slots_;
  // AdamW state for the own update range (the host copies of the device
  // optimizer's, which a const read may refresh: mutable).
  mutable UninitializedArray<float> m_;
  mutable UninitializedArray<float> v_;
  std::unique_ptr<DeviceOptimizer> device_optimizer_;
  // Each micro-batch's forward and backward as a captured unit (the
  // device-resident step; destroyed before the backend, which the model's
  // owner keeps alive longer than this runner).
  std::unique_ptr<compute::CaptureCache> graphs_;
  // The device-resident step's per-micro-batch buffers (PrepareDevice): the
  // tokens (inputs then targets, AllocateHost memory, uploaded
  // asynchronously and left alone until the step's one wait), and the loss
  // sums in backend memory and their host copy, read after that wait.
  compute::Buffer step_tokens_;
  compute::Buffer loss_sums_;
  compute::Buffer loss_sums_host_;
  mutable MomentsNewest moments_newest_ = MomentsNewest::kSynced;
  std::vector<DecayRange> decay_ranges_;
  std::unique_ptr<StateVersions> versions_;
  std::optional<PendingSend> pending_;
  absl::Duration last_pipeline_wait_;
};

}  // namespace cohort::train
