#include "worker/train/training_session.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/backend_factory.h"

namespace cohort::train {

absl::StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::Create(
    const TrainingConfig& config, const model::ModelLayout& layout, const TrainingGroups& groups,
    const TrainingSessionOptions& options) {
  const int dp = groups.data == nullptr ? 1 : groups.data->size();
  if (config.global_batch_size % config.micro_batch_size != 0 ||
      config.micro_batches_per_step() % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: global ", config.global_batch_size, " / micro ", config.micro_batch_size,
        " does not give a whole number of micro-batches on each of ", dp, " data-parallel ranks"));
  }
  std::unique_ptr<TrainingSession> session(new TrainingSession(config));
  compute::BackendOptions backend;
  backend.num_threads = options.num_threads;
  backend.precision = config.precision;
  ASSIGN_OR_RETURN(session->backend_, compute::CreateBackend(backend));
  model::ModelOptions model_options;
  model_options.max_micro_batch = config.micro_batch_size;
  model_options.layout = layout;
  model_options.tensor_group = groups.tensor;
  model_options.collective_timeout = options.collective_timeout;
  model_options.activation_slots =
      StepRunner::ActivationSlots(layout, config.micro_batches_per_step() / dp);
  ASSIGN_OR_RETURN(session->model_,
                   model::GptModel::Create(config.model, session->backend_.get(), model_options));
  if (options.initialize_parameters) session->model_->InitializeParameters(config.init_seed);

  ASSIGN_OR_RETURN(session->dataset_, LoadDataset(config.data));
  data::SamplerOptions sampler;
  sampler.seed = config.data.sample_seed;
  sampler.context_length = config.model.context_length;
  sampler.global_batch_size = config.global_batch_size;
  sampler.max_token_id = config.model.vocab_size - 1;
  ASSIGN_OR_RETURN(data::BatchSampler created, data::BatchSampler::Create(*session->dataset_, sampler));
  session->sampler_ = std::make_unique<data::BatchSampler>(std::move(created));

  DataParallelOptions data_parallel;
  data_parallel.zero1 = config.zero1;
  data_parallel.timeout = options.collective_timeout;
  session->data_parallel_ =
      std::make_unique<DataParallel>(groups.data, session->model_->num_params(), data_parallel);
  StepRunnerOptions runner;
  runner.num_threads = options.num_threads;
  runner.tensor_group = groups.tensor;
  runner.pipeline_group = groups.pipeline;
  runner.timeout = options.collective_timeout;
  runner.tie_per_micro_batch = options.tie_per_micro_batch;
  runner.gradient_observer = options.gradient_observer;
  runner.state_versions = options.state_versions;
  ASSIGN_OR_RETURN(session->runner_,
                   StepRunner::Create(config, session->model_.get(), session->sampler_.get(),
                                      session->data_parallel_.get(), runner));
  return session;
}

}  // namespace cohort::train
