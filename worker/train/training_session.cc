#include "worker/train/training_session.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/layout/mesh_layout.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/compute/backend_factory.h"
#include "worker/model/gpt_activations.h"
#include "worker/train/gradient_tree.h"
#include "worker/train/reduction_tree.h"

namespace cohort::train {
namespace {

compute::BackendOptions BackendOptionsFor(const TrainingConfig& config,
                                          const TrainingSessionOptions& options) {
  compute::BackendOptions backend;
  backend.kind = config.backend;
  backend.num_threads = options.num_threads;
  backend.precision = config.precision;
  backend.device_index = options.device_index;
  backend.fused_attention = options.fused_attention;
  return backend;
}

}  // namespace

bool TrainingSession::ModelFits(const TrainingSession& other, const TrainingConfig& config,
                                const model::ModelLayout& layout, int activation_slots) {
  const model::GptModel& model = *other.model_;
  return model.config() == config.model && model.layout() == layout &&
         other.config_.precision == config.precision && other.config_.backend == config.backend &&
         other.config_.micro_batch_size >= config.micro_batch_size &&
         model.activation_slots() >= activation_slots;
}

absl::StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::Create(
    const TrainingConfig& config, const model::ModelLayout& layout, const TrainingGroups& groups,
    const TrainingSessionOptions& options) {
  const int dp = groups.data == nullptr ? 1 : groups.data->size();
  // The plan's split (TrainingConfig::micro_batch_shares): one share per
  // data rank, each at least one; the deterministic reduction lets them
  // differ (8 over 3: 3, 3, 2), the transport's needs them even.
  const std::vector<int> shares = config.shares();
  if (config.micro_batch_size < 1 || config.global_batch_size % config.micro_batch_size != 0 ||
      static_cast<int>(shares.size()) != dp ||
      !layout::SharesFit(shares, config.micro_batches_per_step(), !config.deterministic_reduction)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: global ", config.global_batch_size, " / micro ", config.micro_batch_size,
        " split as ", absl::StrJoin(shares, "+"), " is not ",
        config.deterministic_reduction ? "at least one" : "the same number of",
        " micro-batches on each of ", dp, " data-parallel ranks"));
  }
  TrainingSession* const reuse = options.reuse;
  std::unique_ptr<TrainingSession> session(new TrainingSession(config));
  bool own_backend = true;  // not one an earlier session sized already
  // Whether the reservation holds the device snapshot (or nothing was
  // reserved: a backend an earlier session sized, which then allocates it).
  bool snapshot_room = options.checkpoint_snapshot;
  if (options.backend != nullptr) {
    session->backend_ = options.backend;
  } else if (reuse != nullptr && reuse->config_.precision == config.precision &&
             reuse->config_.backend == config.backend) {
    session->backend_ = reuse->backend_;
    own_backend = false;
  } else {
    ASSIGN_OR_RETURN(session->backend_, compute::CreateBackend(BackendOptionsFor(config, options)));
  }
  model::ModelOptions model_options;
  model_options.max_micro_batch = config.micro_batch_size;
  model_options.layout = layout;
  model_options.tensor_group = groups.tensor;
  model_options.collective_timeout = options.collective_timeout;
  model_options.activation_slots = ActivationSlotsFor(config, layout);
  // (ModelFits implies the same precision, so the backend is shared too.)
  if (reuse != nullptr && ModelFits(*reuse, config, layout, model_options.activation_slots)) {
    session->model_ = reuse->model_;
    session->backend_ = reuse->backend_;  // the model's own, whatever options.backend says
    session->reused_model_ = true;
  } else {
    if (own_backend) {
      RETURN_IF_ERROR(ReserveDeviceMemory(config, layout, dp, options, *session, &snapshot_room));
    }
    ASSIGN_OR_RETURN(session->model_,
                     model::GptModel::Create(config.model, session->backend_.get(), model_options));
  }

  if (reuse != nullptr && reuse->config_.data == config.data) {
    session->dataset_ = reuse->dataset_;
    session->validation_dataset_ = reuse->validation_dataset_;
  } else {
    ASSIGN_OR_RETURN(Datasets datasets, LoadDatasets(config.data));
    session->dataset_ = std::move(datasets.train);
    session->validation_dataset_ = std::move(datasets.validation);
  }
  if (reuse != nullptr && reuse->dataset_ == session->dataset_ &&
      reuse->config_.global_batch_size == config.global_batch_size &&
      reuse->config_.model.context_length == config.model.context_length &&
      reuse->config_.model.vocab_size == config.model.vocab_size) {
    session->sampler_ = reuse->sampler_;
  } else {
    data::SamplerOptions sampler;
    sampler.seed = config.data.sample_seed;
    sampler.context_length = config.model.context_length;
    sampler.global_batch_size = config.global_batch_size;
    sampler.max_token_id = config.model.vocab_size - 1;
    ASSIGN_OR_RETURN(data::BatchSampler created,
                     data::BatchSampler::Create(*session->dataset_, sampler));
    session->sampler_ = std::make_shared<data::BatchSampler>(std::move(created));
  }
  if (session->validation_dataset_ != nullptr) {
    if (reuse != nullptr && reuse->validation_dataset_ == session->validation_dataset_ &&
        reuse->config_.global_batch_size == config.global_batch_size &&
        reuse->config_.model.context_length == config.model.context_length &&
        reuse->config_.model.vocab_size == config.model.vocab_size &&
        reuse->config_.validation_batches == config.validation_batches) {
      session->validation_sampler_ = reuse->validation_sampler_;
    } else {
      data::ValidationSamplerOptions validation;
      validation.context_length = config.model.context_length;
      validation.global_batch_size = config.global_batch_size;
      validation.batches = config.validation_batches;
      validation.max_token_id = config.model.vocab_size - 1;
      ASSIGN_OR_RETURN(data::ValidationSampler created,
                       data::ValidationSampler::Create(*session->validation_dataset_, validation));
      session->validation_sampler_ = std::make_shared<data::ValidationSampler>(std::move(created));
    }
  }

  DataParallelOptions data_parallel;
  data_parallel.zero1 = config.zero1;
  data_parallel.timeout = options.collective_timeout;
  data_parallel.deterministic = config.deterministic_reduction;
  data_parallel.micro_batch_shares = shares;
  data_parallel.num_threads = options.num_threads;
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
  runner.capture_micro_batches = options.cuda_graphs == compute::CudaGraphs::kAuto;
  ASSIGN_OR_RETURN(session->runner_,
                   StepRunner::Create(config, session->model_.get(), session->sampler_.get(),
                                      session->data_parallel_.get(), runner));
  if (session->runner_->device_resident()) {
    LOG(INFO) << "model shard on the " << session->backend_->name()
              << " backend; its weights, gradients and optimizer state stay there, and the "
                 "step's end (gradient norm, clipping, AdamW) runs there";
  } else if (session->model_->staged()) {
    LOG(INFO) << "model shard on the " << session->backend_->name()
              << " backend; its weights, gradients and the exchanges between ranks are staged "
                 "through host memory and the collectives run over UCX (device-memory "
                 "collectives are not built)";
  }
  if (snapshot_room && session->runner_->device_resident()) {
    const DataParallel& data = *session->data_parallel_;
    absl::StatusOr<std::unique_ptr<DeviceSnapshot>> snapshot = DeviceSnapshot::Create(
        session->backend_.get(), data.update_end() - data.update_begin());
    if (snapshot.ok()) {
      session->snapshot_ = *std::move(snapshot);
    } else if (absl::IsResourceExhausted(snapshot.status())) {
      LOG(WARNING) << "no device snapshot for checkpoints (" << snapshot.status()
                   << "): each checkpoint copies the state to the host while training waits";
    } else {
      return snapshot.status();
    }
  }
  if (session->reused_model_) {
    StepRunner& lender = *reuse->runner_;
    session->runner_->TakeScratchOf(lender);
    if (lender.versions().newest() < 0 && lender.versions().current() < 0) {
      session->runner_->TakeStateBuffersOf(lender);
    }
  }
  if (options.initialize_parameters && !session->reused_model_) session->InitializeParameters();
  return session;
}

absl::Status TrainingSession::ReserveDeviceMemory(const TrainingConfig& config,
                                                  const model::ModelLayout& layout, int dp,
                                                  const TrainingSessionOptions& options,
                                                  TrainingSession& session, bool* snapshot) {
  compute::Backend& backend = *session.backend_;
  ASSIGN_OR_RETURN(uint64_t bytes, EstimateDeviceBytes(config, layout, dp, backend, options));
  if (bytes == 0) return absl::OkStatus();
  absl::Status reserved = backend.ReserveDeviceMemory(bytes);
  if (!reserved.ok() && options.checkpoint_snapshot &&
      RunsDeviceResident(false, dp, layout, options)) {
    // The snapshot only speeds checkpoints up: a job that fits without it
    // trains without it.
    TrainingSessionOptions without = options;
    without.checkpoint_snapshot = false;
    ASSIGN_OR_RETURN(const uint64_t smaller,
                     EstimateDeviceBytes(config, layout, dp, backend, without));
    if (backend.ReserveDeviceMemory(smaller).ok()) {
      LOG(WARNING) << "the device lacks the " << bytes - smaller
                   << " bytes of a checkpoint snapshot (" << reserved.message()
                   << "): each checkpoint copies the state to the host while training waits";
      *snapshot = false;
      return absl::OkStatus();
    }
  }
  if (!reserved.ok()) {
    return absl::Status(reserved.code(),
                        absl::StrCat("the training session needs ", bytes,
                                     " bytes of device memory (weights, gradients, moments, "
                                     "activations, scratch): ",
                                     reserved.message()));
  }
  return absl::OkStatus();
}

int TrainingSession::ActivationSlotsFor(const TrainingConfig& config,
                                        const model::ModelLayout& layout) {
  const std::vector<int> shares = config.shares();
  return StepRunner::ActivationSlots(layout, *std::max_element(shares.begin(), shares.end()));
}

absl::StatusOr<uint64_t> TrainingSession::EstimateBytes(const TrainingConfig& config,
                                                        const model::ModelLayout& layout, int dp,
                                                        int dp_rank,
                                                        const TrainingSessionOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<compute::Backend> backend,
                   compute::CreateBackend(BackendOptionsFor(config, options)));
  const model::ParameterTable table(config.model, layout);
  const uint64_t n = table.num_params();
  const uint64_t wte = table[model::kWte].numel;
  const int B = config.micro_batch_size, T = config.model.context_length;
  const uint64_t tokens = static_cast<uint64_t>(B) * T;
  const int leaves = config.micro_batches_per_step();
  const std::vector<LeafRange> ranges = LeafRangesOf(config.shares());
  if (static_cast<int>(ranges.size()) != std::max(1, dp)) {
    return absl::InvalidArgumentError(absl::StrCat("TrainingConfig.micro_batch_shares: ",
                                                   ranges.size(), " shares for ", dp,
                                                   " data ranks"));
  }
  const LeafRange range = ranges[static_cast<size_t>(std::clamp(dp_rank, 0, std::max(1, dp) - 1))];
  const uint64_t slots = ActivationSlotsFor(config, layout);
  // The model: weights, gradients, activations (per slot) and their
  // gradients, token ids, the loss gradient (GptModel::BackendBytes, here
  // unrounded); the runner's token ids.
  model::ModelOptions model_options;
  model_options.max_micro_batch = B;
  model_options.layout = layout;
  model_options.activation_slots = static_cast<int>(slots);
  const uint64_t model_bytes =
      model::GptModel::BackendBytes(config.model, *backend, model_options, /*alignment=*/1);
  uint64_t floats = 0;
  const uint64_t int32s = 2 * tokens;  // the runner's
  // (B,T,C) activations as the model stores them (fp32, or bf16 on a GPU
  // computing in bf16): the pipeline's exchanges and their host copies.
  const uint64_t activation_bytes = tokens * static_cast<uint64_t>(config.model.width) *
                                    compute::DTypeSize(backend->activation_dtype());
  uint64_t bytes = 0;
  // The runner: the gradient accumulation, the embedding's, the tie and
  // pipeline send buffers, the moments of the own range.
  const bool tie_per_micro_batch = options.tie_per_micro_batch.value_or(layout.pp == 1);
  const uint64_t tree_buffers = GradientTree::BuffersNeeded(leaves, range);
  floats += tree_buffers * n;
  if (layout.pp == 1 && !tie_per_micro_batch) floats += tree_buffers * wte;
  if (layout.pp > 1 && (layout.first_stage() || layout.last_stage())) floats += wte;
  if (layout.stage > 0) bytes += activation_bytes;
  const uint64_t own =
      config.zero1 ? layout::DataShardRange(n, dp, dp_rank).size() : n;
  floats += 2 * own;
  // ZeRO-1 staging, the previous version, the mirrors (two buffers each).
  const uint64_t padded = layout::PaddedShardedSize(n, dp);
  const uint64_t shard = padded / static_cast<uint64_t>(std::max(1, dp));
  if (dp > 1 && config.deterministic_reduction) {
    // A small gradient's padded copy (without ZeRO-1); the
    // peers' node slices of the own shard and this rank's slices staged for
    // a peer when it holds several nodes (the pairwise exchange's; an upper
    // bound where shared memory reduces in place).
    if (!config.zero1 && padded <= kSmallGradientFloats) floats += padded;
    for (int q = 0; q < dp; ++q) {
      const uint64_t nodes = RangeNodes(leaves, ranges[q].begin, ranges[q].end).size();
      if (q != dp_rank) floats += nodes * shard;
      if (q == dp_rank && nodes > 1) floats += nodes * shard;
    }
  } else if (config.zero1 && dp > 1) {
    floats += padded + shard;
  }
  if (options.state_versions.keep_previous) floats += n + 2 * own;
  if (!backend->host_memory()) {
    // Host staging (gpt_model.h): the weights' and gradients' host copies,
    // the embedding gradient's, a pipeline stage's exchanges (input and
    // output per slot, two gradients), a tensor all-reduce's copy.
    floats += 2 * n + (layout.has_embedding() ? wte : 0);
    if (layout.pp > 1) bytes += (2 * slots + 2) * activation_bytes;
    // The all-reduce copy holds an activation or the loss's 2N fp32 sums.
    if (layout.tp > 1) bytes += std::max<uint64_t>(activation_bytes, 2 * tokens * sizeof(float));
    // A checkpoint snapshot's device buffer and its page-locked host copy.
    if (options.checkpoint_snapshot && RunsDeviceResident(false, dp, layout, options)) {
      floats += 2 * 3 * n;
    }
  }
  const int copies =
      config.zero1 ? layout::OptimizerCopies(true, options.state_versions.optimizer_replicas, dp)
                   : 1;
  // A ring of another size fails Create; the sizes are alike anyway.
  layout::CopyRing ring(dp);
  const std::optional<layout::CopyRing>& given = options.state_versions.copy_ring;
  if (given.has_value() && given->size() == dp) ring = *given;
  for (int j = 1; j < copies; ++j) {
    floats += 4 * layout::DataShardRange(n, dp, ring.Owner(dp_rank, j)).size();
  }
  return model_bytes + bytes + floats * sizeof(float) + int32s * sizeof(int32_t);
}

}  // namespace cohort::train
