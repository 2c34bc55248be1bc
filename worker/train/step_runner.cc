#include "worker/train/step_runner.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/train/grad_norm.h"
#include "worker/train/lr_schedule.h"

namespace cohort::train {

absl::StatusOr<std::unique_ptr<StepRunner>> StepRunner::Create(const TrainingConfig& config,
                                                              model::GptModel* model,
                                                              const data::BatchSampler* sampler,
                                                              DataParallel* data_parallel,
                                                              int num_threads) {
  const int dp = data_parallel->dp();
  if (config.micro_batch_size < 1 || config.global_batch_size % config.micro_batch_size != 0 ||
      config.micro_batches_per_step() % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: global ", config.global_batch_size, " / micro ", config.micro_batch_size,
        " does not give a whole number of micro-batches on each of ", dp, " data-parallel ranks"));
  }
  return std::unique_ptr<StepRunner>(
      new StepRunner(config, model, sampler, data_parallel, num_threads));
}

StepRunner::StepRunner(const TrainingConfig& config, model::GptModel* model,
                       const data::BatchSampler* sampler, DataParallel* data_parallel,
                       int num_threads)
    : config_(config),
      model_(model),
      sampler_(sampler),
      data_parallel_(data_parallel),
      num_threads_(num_threads),
      micro_batches_per_rank_(config.micro_batches_per_step() / data_parallel->dp()) {
  const size_t tokens = static_cast<size_t>(config.micro_batch_size) *
                        static_cast<size_t>(config.model.context_length);
  inputs_.resize(tokens);
  targets_.resize(tokens);
  if (micro_batches_per_rank_ > 1) accumulated_.resize(model->num_params());
  const size_t own = data_parallel->update_end() - data_parallel->update_begin();
  m_.assign(own, 0.0f);
  v_.assign(own, 0.0f);
  decay_ranges_ = WeightDecayRanges(model->table(), data_parallel->update_begin(),
                                    data_parallel->update_end());
}

absl::StatusOr<StepResult> StepRunner::Run(Step step) {
  const int T = config_.model.context_length;
  const int B = config_.micro_batch_size;
  const int per_rank = config_.global_batch_size / data_parallel_->dp();
  const int first_sample = data_parallel_->rank() * per_rank;
  const float loss_scale = 1.0f / static_cast<float>(config_.micro_batches_per_step());
  const size_t n = model_->num_params();
  float* accumulated = micro_batches_per_rank_ > 1 ? accumulated_.data() : model_->grads();

  double local_loss = 0.0;
  for (int m = 0; m < micro_batches_per_rank_; ++m) {
    RETURN_IF_ERROR(sampler_->Fill(step, first_sample + m * B, B, inputs_.data(), targets_.data()));
    model_->ZeroGrad();
    ASSIGN_OR_RETURN(double loss, model_->Forward(inputs_.data(), targets_.data(), B, T));
    RETURN_IF_ERROR(model_->Backward(loss_scale));
    local_loss += loss * static_cast<double>(loss_scale);
    if (micro_batches_per_rank_ > 1) {
      const float* grads = model_->grads();
      if (m == 0) {
        std::memcpy(accumulated, grads, n * sizeof(float));
      } else {
        for (size_t i = 0; i < n; ++i) accumulated[i] += grads[i];
      }
    }
  }

  RETURN_IF_ERROR(data_parallel_->ReduceGradients(accumulated));
  ASSIGN_OR_RETURN(double loss, data_parallel_->Sum(local_loss));
  ASSIGN_OR_RETURN(double norm, data_parallel_->GradNorm(accumulated));
  if (!std::isfinite(loss) || !std::isfinite(norm)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step.value(), ": non-finite loss ", loss, " or gradient norm ", norm,
        "; parameters left unchanged (lower optimizer.learning_rate or set grad_clip)"));
  }
  const size_t begin = data_parallel_->update_begin();
  const size_t count = data_parallel_->update_end() - begin;
  const double clip = ClipScale(norm, config_.grad_clip);
  if (clip != 1.0) ScaleInPlace(accumulated + begin, count, static_cast<float>(clip), num_threads_);

  const double lr = LearningRate(config_.lr, step.value());
  AdamWOptions adamw = config_.adamw;
  adamw.num_threads = num_threads_;
  AdamWSlice slice;
  slice.params = model_->params() + begin;
  slice.grads = accumulated + begin;
  slice.m = m_.data();
  slice.v = v_.data();
  slice.begin = begin;
  slice.count = count;
  RETURN_IF_ERROR(AdamWUpdate(adamw, slice, decay_ranges_, lr, step.value() + 1));
  RETURN_IF_ERROR(data_parallel_->GatherParameters(model_->params()));

  StepResult result;
  result.loss = loss;
  result.grad_norm = norm;
  result.learning_rate = lr;
  result.tokens = static_cast<int64_t>(config_.global_batch_size) * T;
  return result;
}

}  // namespace cohort::train
