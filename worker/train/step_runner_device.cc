// StepRunner's device-resident step (step_runner.h, device_resident()): the
// micro-batch gradients fold in a tree in backend memory, and the step ends
// with the norm, clipping and AdamW as backend ops (DeviceOptimizer). The
// host reads each micro-batch's loss and, once per step, the norm; the
// weights, gradients and moments cross to the host only when a host reader
// asks for them (a checkpoint, a peer transfer, an export), through the
// model's and this runner's host copies, which refresh when read.

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/step_runner.h"

namespace cohort::train {

bool StepRunner::QualifiesForDevice() const {
  return !model_->backend()->host_memory() && data_parallel_->dp() == 1 && layout_.tp == 1 &&
         layout_.pp == 1 && tie_per_micro_batch_ && !embedding_tree_.has_value() &&
         !options_.state_versions.keep_previous && versions_->optimizer_replicas() <= 1;
}

absl::Status StepRunner::PrepareDevice() {
  compute::Backend* backend = model_->backend();
  RETURN_IF_ERROR(tree_.UseBackend(backend));
  // A bf16 backend's GEMMs read the weights from a working copy the
  // optimizer keeps (backend.h, AttachParams), not rounded per call.
  RETURN_IF_ERROR(model_->AttachWeightCopy());
  DeviceOptimizerOptions options;
  options.adamw = config_.adamw;
  options.grad_clip = config_.grad_clip;
  ASSIGN_OR_RETURN(device_optimizer_,
                   DeviceOptimizer::Create(backend, norm_plan_, model_->table(),
                                           data_parallel_->update_begin(),
                                           data_parallel_->update_end(), options));
  const size_t tokens =
      static_cast<size_t>(config_.micro_batch_size) * config_.model.context_length;
  const size_t micro_batches = static_cast<size_t>(micro_batches_per_rank_);
  ASSIGN_OR_RETURN(step_tokens_,
                   backend->AllocateHost(compute::DType::kInt32, 2 * tokens * micro_batches));
  ASSIGN_OR_RETURN(loss_sums_, backend->Allocate(compute::DType::kFloat64, micro_batches));
  ASSIGN_OR_RETURN(loss_sums_host_, backend->AllocateHost(compute::DType::kFloat64, micro_batches));
  // One capture per micro-batch index (each writes its own loss sum), made
  // at the second step and replayed from the third.
  graphs_ = std::make_unique<compute::CaptureCache>(
      backend, options_.capture_micro_batches, "a micro-batch's forward and backward");
  // The moments are in backend memory from now on; the host copies are
  // whatever a restore writes into them (adam_m() marks them) until then.
  moments_newest_ = MomentsNewest::kSynced;
  versions_->set_host_refresh([this] { SyncMomentsToHost(); });
  return absl::OkStatus();
}

void StepRunner::DeviceTokens(int i, int32_t** inputs, int32_t** targets) {
  const size_t tokens =
      static_cast<size_t>(config_.micro_batch_size) * config_.model.context_length;
  *inputs = static_cast<int32_t*>(step_tokens_.data()) + 2 * tokens * i;
  *targets = *inputs + tokens;
}

absl::Status StepRunner::TrainMicroBatchOnDevice(int i, int slot, const int32_t* inputs,
                                                  const int32_t* targets, double loss_scale) {
  model::MicroBatchPass pass;
  pass.slot = slot;
  pass.inputs = inputs;
  pass.targets = targets;
  pass.B = config_.micro_batch_size;
  pass.T = config_.model.context_length;
  pass.loss_scale = loss_scale;
  // The loss stays on the backend until the step's end (FinishOnDevice).
  pass.loss_sum = loss_sums_.Slice(i, 1);
  return model_->TrainMicroBatch(pass, graphs_.get());
}

void StepRunner::AddLeafOnDevice(int leaf, bool kept) {
  compute::Backend* backend = model_->backend();
  const compute::TensorSpan grads = model_->grads_span();
  const model::ParameterInfo& wte = model_->table()[model::kWte];
  // h_i + e_i (step_runner.h: one stage, the tied parts per micro-batch).
  const compute::TensorSpan head = grads.Slice(wte.offset, wte.numel);
  backend->ResidualForward(head, head, model_->embedding_grad_span(), wte.numel);
  tree_.Add(leaf, static_cast<float*>(grads.data), kept);
}

absl::StatusOr<StepResult> StepRunner::FinishOnDevice(Step step) {
  const std::vector<float*> nodes = tree_.Nodes();
  if (nodes.size() != 1) {
    return absl::InternalError(absl::StrCat("a single rank ended its step with ", nodes.size(),
                                            " gradient tree nodes instead of the root"));
  }
  const compute::TensorSpan accumulated{nodes[0], compute::DType::kFloat32, model_->num_params()};
  if (options_.gradient_observer) {
    // Tests and debugging only: the observer reads host memory.
    std::vector<float> host(model_->num_params());
    model_->backend()->CopyToHost(host.data(), accumulated);
    options_.gradient_observer(host.data(), host.size(), data_parallel_->update_begin(),
                               data_parallel_->update_end(), step);
  }
  compute::Backend* backend = model_->backend();
  // Every micro-batch's loss sum comes down with the norm, in the step's
  // one wait (DeviceOptimizer::Norm).
  backend->CopyToHostAsync(loss_sums_host_.data(), loss_sums_.span());
  UploadMomentsIfHostNewer();
  const double lr = LearningRate(config_.lr, step.value());
  versions_->BeforeUpdate(step.value());
  // A non-finite loss sum makes the update skip itself on the device, as a
  // non-finite norm does: the host decides after the wait, the state as it was.
  RETURN_IF_ERROR(device_optimizer_->Enqueue(model_->params_span(), accumulated, lr,
                                             step.value() + 1, loss_sums_.span()));
  ASSIGN_OR_RETURN(double norm, device_optimizer_->Norm());
  // The loss HeadLoss returns on the host path: the sum over the B*T
  // positions divided by their count.
  const int positions = config_.micro_batch_size * config_.model.context_length;
  const auto* sums = static_cast<const double*>(loss_sums_host_.data());
  for (int i = 0; i < micro_batches_per_rank_; ++i) {
    leaf_losses_[leaves_.begin + i] = sums[i] / positions;
  }
  ASSIGN_OR_RETURN(double loss, StepLoss());
  if (!std::isfinite(loss)) {
    versions_->AfterUpdate(step.value());
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step.value(), ": non-finite loss ", loss,
        "; parameters left unchanged (lower optimizer.learning_rate or set grad_clip)"));
  }
  if (!std::isfinite(norm)) {
    // The update skipped itself (backend.h, ClipAdamW): the state is the
    // step before's.
    versions_->AfterUpdate(step.value());
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step.value(), ": non-finite gradient norm ", norm,
        "; parameters left unchanged (lower optimizer.learning_rate or set grad_clip)"));
  }
  model_->MarkParamsChangedOnBackend();
  moments_newest_ = MomentsNewest::kBackendNewer;
  versions_->AfterUpdate(step.value() + 1);

  return ResultOf(loss, norm, lr);
}

void StepRunner::SyncMomentsToHost() const {
  if (moments_newest_ != MomentsNewest::kBackendNewer) return;
  // Returns once the copies are done (backend.h); a device fault shows at
  // the next step's wait.
  model_->backend()->CopyToHost(m_.data(), device_optimizer_->m());
  model_->backend()->CopyToHost(v_.data(), device_optimizer_->v());
  moments_newest_ = MomentsNewest::kSynced;
}

void StepRunner::UploadMomentsIfHostNewer() {
  if (moments_newest_ != MomentsNewest::kHostNewer) return;
  // Synchronous copies (the host arrays are free when they return); a
  // device fault shows at the step's one wait, not in a wait of its own.
  model_->backend()->CopyFromHost(device_optimizer_->m(), m_.data());
  model_->backend()->CopyFromHost(device_optimizer_->v(), v_.data());
  moments_newest_ = MomentsNewest::kSynced;
}

float* StepRunner::WritableMoments(UninitializedArray<float>& moments) {
  if (device_optimizer_ != nullptr) {
    SyncMomentsToHost();
    moments_newest_ = MomentsNewest::kHostNewer;
  }
  return moments.data();
}

const float* StepRunner::ReadableMoments(const UninitializedArray<float>& moments) const {
  if (device_optimizer_ != nullptr) SyncMomentsToHost();
  return moments.data();
}

absl::Status StepRunner::SnapshotState(DeviceSnapshot& snapshot) {
  if (device_optimizer_ == nullptr) {
    return absl::FailedPreconditionError(
        "a device snapshot needs the device-resident step; this runner keeps its state on the host");
  }
  // A restore since the last step wrote the host copies: the backend's are
  // what the snapshot copies.
  RETURN_IF_ERROR(model_->UploadStaleParams());
  UploadMomentsIfHostNewer();
  const size_t begin = device_optimizer_->begin();
  return snapshot.Take(model_->params_span().Slice(begin, device_optimizer_->end() - begin),
                       device_optimizer_->m(), device_optimizer_->v());
}

}  // namespace cohort::train
