#include "worker/train/training_session.h"

#include "common/status_macros.h"
#include "worker/compute/backend_factory.h"

namespace cohort::train {

absl::StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::Create(
    const TrainingConfig& config, comm::Communicator* data_group,
    const TrainingSessionOptions& options) {
  std::unique_ptr<TrainingSession> session(new TrainingSession(config));
  compute::BackendOptions backend;
  backend.num_threads = options.num_threads;
  ASSIGN_OR_RETURN(session->backend_, compute::CreateBackend(backend));
  model::ModelOptions model_options;
  model_options.max_micro_batch = config.micro_batch_size;
  ASSIGN_OR_RETURN(session->model_,
                   model::GptModel::Create(config.model, session->backend_.get(), model_options));
  session->model_->InitializeParameters(config.init_seed);

  ASSIGN_OR_RETURN(session->dataset_, LoadDataset(config.data));
  data::SamplerOptions sampler;
  sampler.seed = config.data.sample_seed;
  sampler.context_length = config.model.context_length;
  sampler.global_batch_size = config.global_batch_size;
  sampler.max_token_id = config.model.vocab_size - 1;
  ASSIGN_OR_RETURN(data::BatchSampler created, data::BatchSampler::Create(*session->dataset_, sampler));
  session->sampler_ = std::make_unique<data::BatchSampler>(std::move(created));

  DataParallelOptions dp;
  dp.zero1 = config.zero1;
  dp.timeout = options.collective_timeout;
  dp.num_threads = options.num_threads;
  session->data_parallel_ =
      std::make_unique<DataParallel>(data_group, session->model_->num_params(), dp);
  ASSIGN_OR_RETURN(session->runner_,
                   StepRunner::Create(config, session->model_.get(), session->sampler_.get(),
                                      session->data_parallel_.get(), options.num_threads));
  return session;
}

}  // namespace cohort::train
