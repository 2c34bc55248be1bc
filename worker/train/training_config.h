#pragma once
// TrainingConfig: what a worker needs from a JobSpec to train, in engine
// types, plus the data source it names.
//
// Every spec is read through the one validator and its defaults
// (common/job_spec/validator.h): the coordinator normalises a spec at submit,
// and TrainingConfigFromSpec normalises what it is given again (a no-op for
// the coordinator's, the defaults for one a tool or test built), so no
// default or spec rule is restated here.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cohort/v1/job.pb.h"
#include "worker/compute/backend_factory.h"
#include "worker/data/markov_source.h"
#include "worker/data/token_dataset.h"
#include "worker/model/gpt_config.h"
#include "worker/train/adamw.h"
#include "worker/train/lr_schedule.h"

namespace cohort::train {

struct DataSourceConfig {
  bool synthetic = false;
  data::MarkovSourceOptions markov;  // synthetic
  int64_t synthetic_tokens = 0;      // synthetic
  std::string pattern;               // shards: glob of llm.c .bin files
  uint64_t sample_seed = 0;          // the determinism contract's seed
  // data.validation: held-out shards, or the tail fraction of the data
  // above held out (at most one is set; neither: no validation data).
  std::string validation_pattern;
  double held_out_fraction = 0.0;

  bool has_validation() const { return !validation_pattern.empty() || held_out_fraction > 0; }

  friend bool operator==(const DataSourceConfig&, const DataSourceConfig&) = default;
};

struct TrainingConfig {
  model::GptConfig model;
  uint64_t init_seed = 0;
  int global_batch_size = 0;  // sequences per optimizer step
  int micro_batch_size = 0;   // sequences per forward/backward
  int64_t steps = 0;
  LrScheduleOptions lr;
  AdamWOptions adamw;
  double grad_clip = 0.0;  // 0: no clipping
  bool zero1 = false;
  // parallelism.reduction: the fixed-tree order (data_parallel.h) unless
  // REDUCTION_TRANSPORT.
  bool deterministic_reduction = true;
  // The step's micro-batches each data rank trains, in data-rank order: the
  // generation's plan's split (Mesh.micro_batches), which the worker takes
  // and does not compute. Empty: one data rank trains them all.
  std::vector<int> micro_batch_shares;
  // device_kind: where the model's layers run (the CUDA backend on a GPU
  // job; the optimizer and the reductions work in host memory either way,
  // gpt_model.h "Memory").
  compute::BackendKind backend = compute::BackendKind::kCpu;
  // model.precision (unspecified: fp32 on a CPU job).
  compute::Precision precision = compute::Precision::kFp32;
  DataSourceConfig data;
  // data.validation: after every validation_interval-th step (0: none but
  // the last) and after the last step, the mean loss over validation_batches
  // fixed held-out batches (data/validation_sampler.h). Only with
  // data.has_validation().
  int64_t validation_interval = 0;
  int validation_batches = 0;

  // Whether the loop validates after `done` completed steps.
  bool ValidatesAfter(int64_t done) const {
    return data.has_validation() &&
           (done == steps || (validation_interval > 0 && done % validation_interval == 0));
  }
  int micro_batches_per_step() const { return global_batch_size / micro_batch_size; }
  // micro_batch_shares, or the one share of a single data rank.
  std::vector<int> shares() const {
    return micro_batch_shares.empty() ? std::vector<int>{micro_batches_per_step()}
                                      : micro_batch_shares;
  }
};

// The engine's view of `spec` for a generation whose plan splits the step's
// micro-batches over its data ranks as `micro_batch_shares` (the mesh's
// Mesh.micro_batches; empty: one data rank). InvalidArgument: the
// validator's message (every bad field, named), or a split that is not one
// of the spec's micro-batches (layout::SharesFit: each rank at least one,
// the transport's reduction an even split). Internal: a validated spec the
// engine still cannot hold (a defect). A GPU job runs on the CUDA backend in
// its precision; tensor and pipeline degrees are the mesh's
// (ModelLayout::Validate checks the shard when the model is built).
absl::StatusOr<TrainingConfig> TrainingConfigFromSpec(const v1::JobSpec& spec,
                                                      std::vector<int> micro_batch_shares);

// The tokens `config` trains on (`train`): the synthetic stream generated in
// memory (identical on every worker), or the shards matching the pattern
// (memory-mapped), less a held-out tail; and the validation tokens
// (`validation`, null without validation data): that tail or the shards of
// validation_pattern. Errors: InvalidArgument (bad synthetic options or
// fraction), the shard errors of data/token_dataset.h (NotFound for no
// match, DataLoss for a corrupt file), each naming the spec field.
struct Datasets {
  std::shared_ptr<const data::TokenDataset> train;
  std::shared_ptr<const data::TokenDataset> validation;
};
absl::StatusOr<Datasets> LoadDatasets(const DataSourceConfig& config);

}  // namespace cohort::train
