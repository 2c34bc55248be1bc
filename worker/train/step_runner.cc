#include "worker/train/step_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/layout/mesh_layout.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/train/grad_norm.h"
#include "worker/train/lr_schedule.h"

namespace cohort::train {
namespace {

// Pipeline messages between a pair of stages flow one way per kind
// (activations forward, gradients back), so one tag and the per-pair order
// are enough; NCCL supports only tag 0.
constexpr uint32_t kPipelineTag = 0;

float* Floats(const compute::TensorSpan& span) { return static_cast<float*>(span.data); }

absl::Status CheckGroup(const char* name, comm::Communicator* group, int size, int rank) {
  if (size == 1) return absl::OkStatus();
  if (group == nullptr || group->size() != size || group->rank() != rank) {
    return absl::InvalidArgumentError(absl::StrCat("StepRunnerOptions.", name, " must have ", size,
                                                   " ranks with this rank at ", rank));
  }
  return absl::OkStatus();
}

}  // namespace

int StepRunner::ActivationSlots(const model::ModelLayout& layout, int micro_batches) {
  return std::max(1, std::min(micro_batches, layout.pp - layout.stage));
}

absl::StatusOr<std::unique_ptr<StepRunner>> StepRunner::Create(
    const TrainingConfig& config, model::GptModel* model, const data::BatchSampler* sampler,
    DataParallel* data_parallel, const StepRunnerOptions& options) {
  const int dp = data_parallel->dp();
  if (config.micro_batch_size < 1 || config.global_batch_size % config.micro_batch_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: global ", config.global_batch_size, " / micro ",
                     config.micro_batch_size, " is not a whole number of micro-batches"));
  }
  if (data_parallel->micro_batches() != config.micro_batches_per_step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DataParallelOptions.micro_batch_shares: ", data_parallel->micro_batches(),
        " but the batch has ", config.micro_batches_per_step(), " micro-batches per step"));
  }
  std::vector<int> shares;
  for (const LeafRange& range : data_parallel->leaf_ranges()) shares.push_back(range.count());
  if (!layout::SharesFit(shares, config.micro_batches_per_step(),
                         !data_parallel->deterministic())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: ", config.micro_batches_per_step(), " micro-batches over ", dp,
        " data-parallel ranks: each needs one",
        data_parallel->deterministic() ? "" : ", and the transport's reduction an even split"));
  }
  const model::ModelLayout& layout = model->layout();
  RETURN_IF_ERROR(CheckGroup("tensor_group", options.tensor_group, layout.tp, layout.tp_rank));
  RETURN_IF_ERROR(CheckGroup("pipeline_group", options.pipeline_group, layout.pp, layout.stage));
  if (layout.pp > 1 && options.tie_per_micro_batch.value_or(false)) {
    return absl::InvalidArgumentError(
        "StepRunnerOptions.tie_per_micro_batch needs pipeline parallelism 1: the two parts of "
        "the tied embedding gradient live on different stages");
  }
  if (layout.pp == 1 && dp > 1 && data_parallel->deterministic() &&
      !options.tie_per_micro_batch.value_or(true)) {
    return absl::InvalidArgumentError(
        "StepRunnerOptions.tie_per_micro_batch = false without pipeline parallelism is a "
        "single-process reference; with the deterministic reduction it needs one data rank");
  }
  if (options.state_versions.copy_ring.has_value() &&
      options.state_versions.copy_ring->size() != dp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StepRunnerOptions.state_versions.copy_ring: ", options.state_versions.copy_ring->size(),
        " ranks, but the data group has ", dp));
  }
  ASSIGN_OR_RETURN(std::vector<PipelineOp> schedule,
                   OneForwardOneBackwardSchedule(layout.pp, layout.stage,
                                                 data_parallel->leaf_range().count()));
  std::unique_ptr<StepRunner> runner(
      new StepRunner(config, model, sampler, data_parallel, options, std::move(schedule)));
  if (runner->QualifiesForDevice()) RETURN_IF_ERROR(runner->PrepareDevice());
  return runner;
}

StepRunner::StepRunner(const TrainingConfig& config, model::GptModel* model,
                       const data::BatchSampler* sampler, DataParallel* data_parallel,
                       const StepRunnerOptions& options, std::vector<PipelineOp> schedule)
    : config_(config),
      model_(model),
      sampler_(sampler),
      data_parallel_(data_parallel),
      options_(options),
      layout_(model->layout()),
      schedule_(std::move(schedule)),
      leaves_(data_parallel->leaf_range()),
      micro_batches_per_rank_(leaves_.count()),
      slots_(ActivationSlots(layout_, micro_batches_per_rank_)),
      tie_per_micro_batch_(options.tie_per_micro_batch.value_or(layout_.pp == 1)),
      norm_plan_(config.model, model->table()),
      tree_(model->num_params(), config.micro_batches_per_step(), leaves_,
            options.num_threads) {
  if (layout_.pp == 1 && !tie_per_micro_batch_) {
    embedding_tree_.emplace(model->table()[model::kWte].numel, config.micro_batches_per_step(),
                            leaves_, options.num_threads);
  }
  leaf_losses_.assign(static_cast<size_t>(config.micro_batches_per_step()), 0.0);
  const size_t tokens = static_cast<size_t>(config.micro_batch_size) *
                        static_cast<size_t>(config.model.context_length);
  inputs_.resize(tokens);
  targets_.resize(tokens);
  const size_t wte = model->table()[model::kWte].numel;
  if (layout_.pp > 1 && (layout_.first_stage() || layout_.last_stage())) tie_buffer_.resize(wte);
  if (layout_.stage > 0) {
    // An input gradient (B,T,C) in the model's activation dtype.
    send_buffer_.resize(tokens * config.model.width *
                        compute::DTypeSize(model->backend()->activation_dtype()));
  }
  const size_t own = data_parallel->update_end() - data_parallel->update_begin();
  // Not zeroed: a restore overwrites them, a fresh start zeroes them
  // (ResetOptimizerState). Room for any data rank's range, so that a
  // session for another rank can take them over (TakeStateBuffersOf).
  const size_t any_range = std::max(own, data_parallel->shard_size());
  m_.Resize(own, any_range);
  v_.Resize(own, any_range);
  decay_ranges_ = WeightDecayRanges(model->table(), data_parallel->update_begin(),
                                    data_parallel->update_end());
  versions_ = std::make_unique<StateVersions>(
      model, m_.data(), v_.data(), data_parallel->update_begin(), data_parallel->update_end(),
      data_parallel->dp(), data_parallel->rank(), data_parallel->zero1(), options.state_versions);
}

void StepRunner::ResetOptimizerState() {
  if (device_optimizer_ != nullptr) {
    device_optimizer_->ResetMoments();
    moments_newest_ = MomentsNewest::kBackendNewer;
    versions_->SetCurrent(0);
    return;
  }
  if (m_.size() > 0) {
    std::memset(m_.data(), 0, m_.size() * sizeof(float));
    std::memset(v_.data(), 0, v_.size() * sizeof(float));
  }
  versions_->SetCurrent(0);
}

void StepRunner::TakeScratchOf(StepRunner& other) {
  tree_.TakeBuffersOf(other.tree_);
  if (embedding_tree_.has_value() && other.embedding_tree_.has_value()) {
    embedding_tree_->TakeBuffersOf(*other.embedding_tree_);
  }
}

void StepRunner::TakeStateBuffersOf(StepRunner& other) {
  m_.TakeFrom(other.m_, m_.size());
  v_.TakeFrom(other.v_, v_.size());
  // The versions point at the moments: new ones over the taken buffers.
  auto versions = std::make_unique<StateVersions>(
      model_, m_.data(), v_.data(), data_parallel_->update_begin(), data_parallel_->update_end(),
      data_parallel_->dp(), data_parallel_->rank(), data_parallel_->zero1(),
      options_.state_versions);
  versions->TakeBuffersOf(*other.versions_);
  versions_ = std::move(versions);
  if (device_optimizer_ != nullptr) versions_->set_host_refresh([this] { SyncMomentsToHost(); });
}

void StepRunner::Reserve() {
  m_.ResizeAndTouch(m_.size());
  v_.ResizeAndTouch(v_.size());
  tree_.Reserve();
  if (embedding_tree_.has_value()) embedding_tree_->Reserve();
  versions_->Reserve();
}

absl::Status StepRunner::FlushSend() {
  if (!pending_) return absl::OkStatus();
  const PendingSend send = *pending_;
  pending_.reset();
  return options_.pipeline_group->Send(send.data, send.bytes, send.peer, kPipelineTag,
                                       options_.timeout);
}

absl::Status StepRunner::Exchange(void* data, size_t bytes, int peer) {
  const absl::Time start = absl::Now();
  absl::Status status;
  if (pending_) {
    const PendingSend send = *pending_;
    pending_.reset();
    status = options_.pipeline_group->SendRecv(send.data, send.bytes, send.peer, data, bytes, peer,
                                               kPipelineTag, options_.timeout);
  } else {
    status = options_.pipeline_group->Recv(data, bytes, peer, kPipelineTag, options_.timeout);
  }
  last_pipeline_wait_ += absl::Now() - start;
  return status;
}

absl::Status StepRunner::RunSchedule(Step step, const std::atomic<bool>* cancel) {
  const int T = config_.model.context_length;
  const int B = config_.micro_batch_size;
  // Each micro-batch's share of the step's mean loss, in double: a float
  // 1/m would scale loss and gradients by m * fl32(1/m) (1 + 3e-8 for m = 3).
  const double loss_scale = 1.0 / config_.micro_batches_per_step();
  const bool first = layout_.first_stage();
  const bool last = layout_.last_stage();
  tree_.Begin();
  if (embedding_tree_.has_value()) embedding_tree_->Begin();
  std::fill(leaf_losses_.begin(), leaf_losses_.end(), 0.0);
  for (const PipelineOp& op : schedule_) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return absl::AbortedError("step cancelled");
    }
    const int i = op.micro_batch;
    const int leaf = leaves_.begin + i;  // the step's micro-batch index
    const int slot = i % slots_;
    if (op.kind == PipelineOpKind::kForward) {
      int32_t* inputs = inputs_.data();
      int32_t* targets = targets_.data();
      if (device_optimizer_ != nullptr) DeviceTokens(i, &inputs, &targets);
      if (first || last) {
        RETURN_IF_ERROR(sampler_->Fill(step, leaf * B, B, inputs, targets));
      }
      if (!first) {
        // Activations move as the model stores them (bf16 or fp32): span.bytes().
        const compute::TensorSpan input = model_->StageInput(slot, B, T);
        RETURN_IF_ERROR(Exchange(input.data, input.bytes(), layout_.stage - 1));
      } else {
        RETURN_IF_ERROR(FlushSend());
      }
      if (device_optimizer_ != nullptr) {
        // One rank (schedule F0 B0 F1 B1 ...): the forward and its backward
        // in one unit; the backward op below only folds the gradients.
        RETURN_IF_ERROR(TrainMicroBatchOnDevice(i, slot, inputs, targets, loss_scale));
        continue;
      }
      ASSIGN_OR_RETURN(double loss, model_->ForwardStage(slot, inputs, targets, B, T));
      // Divided by the micro-batch count once, in StepLoss.
      if (last) leaf_losses_[leaf] = loss;
      if (!last) {
        const compute::TensorSpan output = model_->StageOutput(slot);
        pending_ = PendingSend{output.data, output.bytes(), layout_.stage + 1};
      }
      continue;
    }
    // The model's gradients stay intact after the rank's last backward
    // until the next step: that leaf need not be copied.
    const bool kept = i + 1 == micro_batches_per_rank_;
    if (device_optimizer_ != nullptr) {  // its backward ran with its forward
      AddLeafOnDevice(leaf, kept);
      continue;
    }
    if (!last) {
      const compute::TensorSpan output_grad = model_->StageOutputGrad(B, T);
      RETURN_IF_ERROR(Exchange(output_grad.data, output_grad.bytes(), layout_.stage + 1));
    } else {
      RETURN_IF_ERROR(FlushSend());
    }
    model_->ZeroGrad();
    RETURN_IF_ERROR(model_->BackwardStage(slot, loss_scale));
    if (!first) {
      // The model reuses that buffer for the next backward's received gradient.
      const compute::TensorSpan input_grad = model_->StageInputGrad();
      CHECK(input_grad.bytes() <= send_buffer_.size());
      std::memcpy(send_buffer_.data(), input_grad.data, input_grad.bytes());
      pending_ = PendingSend{send_buffer_.data(), input_grad.bytes(), layout_.stage - 1};
    }
    float* grads = model_->grads();
    const compute::TensorSpan embedding = model_->embedding_grad();
    if (layout_.has_embedding()) {
      if (embedding_tree_.has_value()) {
        embedding_tree_->Add(leaf, Floats(embedding), kept);
      } else {
        // h_i + e_i; on a pipeline's first stage 0 + e_i (see step_runner.h).
        AddInPlace(grads + model_->table()[model::kWte].offset, Floats(embedding),
                   embedding.numel, options_.num_threads);
      }
    }
    tree_.Add(leaf, grads, kept);
  }
  return FlushSend();
}

absl::StatusOr<float*> StepRunner::ReduceOverData() {
  std::vector<float*> nodes = tree_.Nodes();
  const model::ParameterInfo& wte = model_->table()[model::kWte];
  const bool tie_across_stages =
      layout_.pp > 1 && (layout_.first_stage() || layout_.last_stage());
  if (data_parallel_->deterministic()) {
    // Under ZeRO-1 the pipeline's end stages need their whole wte part summed
    // before they exchange it.
    const layout::ShardRange replicated =
        tie_across_stages ? layout::ShardRange{wte.offset, wte.offset + wte.numel}
                          : layout::ShardRange{};
    ASSIGN_OR_RETURN(float* reduced, data_parallel_->ReduceGradientTree(nodes, replicated));
    RETURN_IF_ERROR(TieEmbedding(reduced));
    return reduced;
  }
  // The transport's reduction: the rank's nodes in order, then the
  // communicator's sum of the ranks' sums.
  float* local = nodes[0];
  for (size_t j = 1; j < nodes.size(); ++j) {
    AddInPlace(local, nodes[j], model_->num_params(), options_.num_threads);
  }
  RETURN_IF_ERROR(TieEmbedding(local));
  RETURN_IF_ERROR(data_parallel_->ReduceGradients(local));
  return local;
}

absl::StatusOr<double> StepRunner::StepLoss() {
  const double micro_batches = config_.micro_batches_per_step();
  if (!data_parallel_->deterministic()) {
    // The rank's losses in micro-batch order, then the communicator's sum.
    double local = 0.0;
    for (int leaf = leaves_.begin; leaf < leaves_.end; ++leaf) local += leaf_losses_[leaf];
    ASSIGN_OR_RETURN(double loss, data_parallel_->Sum(local));
    if (options_.pipeline_group != nullptr && layout_.pp > 1) {
      // Only the last stage has the loss; the others add 0 (exact).
      RETURN_IF_ERROR(options_.pipeline_group->AllReduce(
          &loss, 1, comm::DataType::kFloat64, comm::ReduceOp::kSum, options_.timeout));
    }
    return loss / micro_batches;
  }
  // Each micro-batch's loss is nonzero on one rank only, so these sums are
  // exact whatever their order; the tree then adds them.
  RETURN_IF_ERROR(data_parallel_->SumInPlace(&leaf_losses_));
  if (options_.pipeline_group != nullptr && layout_.pp > 1) {
    RETURN_IF_ERROR(options_.pipeline_group->AllReduce(leaf_losses_.data(), leaf_losses_.size(),
                                                       comm::DataType::kFloat64,
                                                       comm::ReduceOp::kSum, options_.timeout));
  }
  return TreeSum(leaf_losses_.data(), static_cast<int>(leaf_losses_.size())) / micro_batches;
}

absl::StatusOr<double> StepRunner::Evaluate(const data::ValidationSampler& sampler,
                                            const std::atomic<bool>* cancel) {
  const int T = config_.model.context_length;
  const int B = config_.micro_batch_size;
  const int micro_batches = config_.micro_batches_per_step();
  const int batches = sampler.options().batches;
  if (sampler.options().global_batch_size != config_.global_batch_size ||
      sampler.options().context_length != T) {
    return absl::InvalidArgumentError("validation sampler: batch or context differs from the job's");
  }
  const bool first = layout_.first_stage();
  const bool last = layout_.last_stage();
  RETURN_IF_ERROR(model_->set_tensor_group(options_.tensor_group));
  model_->set_cancel(cancel);
  // Batch b's micro-batch losses at [b * micro_batches, (b + 1) * micro_batches).
  std::vector<double> losses(static_cast<size_t>(batches) * micro_batches, 0.0);
  const absl::Status forwarded = [&]() -> absl::Status {
    for (int b = 0; b < batches; ++b) {
      for (int leaf = leaves_.begin; leaf < leaves_.end; ++leaf) {
        if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
          return absl::AbortedError("validation cancelled");
        }
        if (first || last) {
          RETURN_IF_ERROR(sampler.Fill(b, leaf * B, B, inputs_.data(), targets_.data()));
        }
        // Forward only: each stage receives, computes and sends on; nothing
        // flows back, so plain sends cannot deadlock. Slot 0 is free between
        // steps.
        if (!first) {
          const compute::TensorSpan input = model_->StageInput(0, B, T);
          RETURN_IF_ERROR(options_.pipeline_group->Recv(input.data, input.bytes(),
                                                        layout_.stage - 1, kPipelineTag,
                                                        options_.timeout));
        }
        ASSIGN_OR_RETURN(double loss,
                         model_->ForwardStage(0, inputs_.data(), targets_.data(), B, T));
        if (last) losses[static_cast<size_t>(b) * micro_batches + leaf] = loss;
        if (!last) {
          const compute::TensorSpan output = model_->StageOutput(0);
          RETURN_IF_ERROR(options_.pipeline_group->Send(output.data, output.bytes(),
                                                        layout_.stage + 1, kPipelineTag,
                                                        options_.timeout));
        }
      }
    }
    return absl::OkStatus();
  }();
  model_->set_cancel(nullptr);
  RETURN_IF_ERROR(forwarded);
  // Each entry is nonzero on one rank only (its data rank's last stage), so
  // these sums are exact in any order; the tree then adds each batch.
  RETURN_IF_ERROR(data_parallel_->SumInPlace(&losses));
  if (options_.pipeline_group != nullptr && layout_.pp > 1) {
    RETURN_IF_ERROR(options_.pipeline_group->AllReduce(losses.data(), losses.size(),
                                                       comm::DataType::kFloat64,
                                                       comm::ReduceOp::kSum, options_.timeout));
  }
  double total = 0.0;
  for (int b = 0; b < batches; ++b) {
    total += TreeSum(losses.data() + static_cast<size_t>(b) * micro_batches, micro_batches) /
             micro_batches;
  }
  return total / batches;
}

absl::Status StepRunner::TieEmbedding(float* reduced) {
  const model::ParameterInfo& wte = model_->table()[model::kWte];
  float* own = reduced + wte.offset;
  if (embedding_tree_.has_value()) {
    // One stage, parts apart: (tree of h) + (tree of e). The deterministic
    // reduction allows this with one data rank only, where the embedding
    // tree is its root; the transport's adds the rank's nodes in order.
    for (const float* node : embedding_tree_->Nodes()) {
      AddInPlace(own, node, wte.numel, options_.num_threads);
    }
    return absl::OkStatus();
  }
  if (layout_.pp == 1 || !(layout_.first_stage() || layout_.last_stage())) {
    return absl::OkStatus();
  }
  const int other = layout_.first_stage() ? layout_.pp - 1 : 0;
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(options_.pipeline_group->SendRecv(own, wte.numel * sizeof(float), other,
                                                    tie_buffer_.data(),
                                                    wte.numel * sizeof(float), other,
                                                    kPipelineTag, options_.timeout));
  last_pipeline_wait_ += absl::Now() - start;
  AddInPlace(own, tie_buffer_.data(), wte.numel, options_.num_threads);
  return absl::OkStatus();
}

absl::StatusOr<double> StepRunner::GlobalNorm(const float* accumulated) {
  norm_plan_.Fill(accumulated, data_parallel_->update_begin(), data_parallel_->update_end(),
                  &norm_slots_, options_.num_threads);
  const size_t count = norm_slots_.size();
  // ZeRO-1 ranks hold disjoint shards; plain data-parallel ranks hold the
  // same whole gradient and must not add it up dp times.
  if (data_parallel_->zero1()) RETURN_IF_ERROR(data_parallel_->SumInPlace(&norm_slots_));
  for (comm::Communicator* group : {options_.tensor_group, options_.pipeline_group}) {
    if (group == nullptr || group->size() == 1) continue;
    RETURN_IF_ERROR(group->AllReduce(norm_slots_.data(), count, comm::DataType::kFloat64,
                                     comm::ReduceOp::kSum, options_.timeout));
  }
  return GradNormPlan::Norm(norm_slots_);
}

absl::StatusOr<StepResult> StepRunner::Run(Step step, const std::atomic<bool>* cancel) {
  last_pipeline_wait_ = absl::ZeroDuration();
  pending_.reset();
  // The model may have been trained by another runner before (a session
  // rebuilt around it): it runs over this runner's tensor group.
  RETURN_IF_ERROR(model_->set_tensor_group(options_.tensor_group));
  // The model may be shared with a runner of another kind (a session kept
  // across a re-plan): say where this one wants the gradients.
  model_->set_gradients_stay_on_backend(device_resident());
  model_->set_cancel(cancel);
  const absl::Status scheduled = RunSchedule(step, cancel);
  model_->set_cancel(nullptr);  // the end phase runs to its end or a collective's error
  RETURN_IF_ERROR(scheduled);
  if (device_resident()) return FinishOnDevice(step);

  ASSIGN_OR_RETURN(float* accumulated, ReduceOverData());
  if (options_.gradient_observer) {
    options_.gradient_observer(accumulated, model_->num_params(), data_parallel_->update_begin(),
                               data_parallel_->update_end(), step);
  }
  ASSIGN_OR_RETURN(double loss, StepLoss());
  ASSIGN_OR_RETURN(double norm, GlobalNorm(accumulated));
  if (!std::isfinite(loss) || !std::isfinite(norm)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step.value(), ": non-finite loss ", loss, " or gradient norm ", norm,
        "; parameters left unchanged (lower optimizer.learning_rate or set grad_clip)"));
  }
  const size_t begin = data_parallel_->update_begin();
  const size_t count = data_parallel_->update_end() - begin;
  const double clip = ClipScale(norm, config_.grad_clip);
  if (clip != 1.0) ScaleInPlace(accumulated + begin, count, static_cast<float>(clip),
                                options_.num_threads);

  const double lr = LearningRate(config_.lr, step.value());
  AdamWOptions adamw = config_.adamw;
  adamw.num_threads = options_.num_threads;
  AdamWSlice slice;
  slice.params = model_->params() + begin;
  slice.grads = accumulated + begin;
  slice.m = m_.data();
  slice.v = v_.data();
  slice.begin = begin;
  slice.count = count;
  // From here the state changes: keep the version it had.
  versions_->BeforeUpdate(step.value());
  RETURN_IF_ERROR(AdamWUpdate(adamw, slice, decay_ranges_, lr, step.value() + 1));
  RETURN_IF_ERROR(data_parallel_->GatherParameters(model_->params()));
  RETURN_IF_ERROR(
      versions_->ExchangeMirrors(data_parallel_->group(), step.value() + 1, options_.timeout));
  versions_->AfterUpdate(step.value() + 1);

  return ResultOf(loss, norm, lr);
}

StepResult StepRunner::ResultOf(double loss, double norm, double lr) const {
  StepResult result;
  result.loss = loss;
  result.grad_norm = norm;
  result.learning_rate = lr;
  result.tokens = static_cast<int64_t>(config_.global_batch_size) * config_.model.context_length;
  return result;
}

}  // namespace cohort::train
