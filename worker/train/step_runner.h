#pragma once
// StepRunner: one optimizer step of data-parallel training on this rank.
//
//   for each of this rank's micro-batches m (ascending):
//     grads = d(mean loss of m / micro_batches_per_step)/d(params)
//     accumulated += grads              (the first one is copied)
//   sum `accumulated` over the data group    (DataParallel, ZeRO-1 or not)
//   clip by the global norm, AdamW on the own range, gather parameters
//
// Each micro-batch's gradient is computed into zeroed buffers and then added,
// so the accumulation order is "micro-batch 0, 1, 2, ..." whatever the
// layout: with one micro-batch per rank and dp = 2, every element is g0 + g1
// exactly as in a single process that runs both micro-batches, so the two are
// bitwise identical. The samples of micro-batch m of rank r come from the
// sampler's (seed, step) alone (the determinism contract): rank r takes the
// global batch's sequences [r * B/dp, (r+1) * B/dp).
//
// Thread-compatible: one Run at a time.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ids.h"
#include "worker/data/batch_sampler.h"
#include "worker/model/gpt_model.h"
#include "worker/train/adamw.h"
#include "worker/train/data_parallel.h"
#include "worker/train/training_config.h"

namespace cohort::train {

struct StepResult {
  double loss = 0;       // mean over every token of the global batch
  double grad_norm = 0;  // global L2 norm before clipping
  double learning_rate = 0;
  int64_t tokens = 0;  // tokens of the global batch
};

class StepRunner {
 public:
  // Every pointer must outlive the runner. Errors: InvalidArgument when the
  // batch does not divide over dp or exceeds the model's micro-batch
  // capacity.
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(const TrainingConfig& config,
                                                            model::GptModel* model,
                                                            const data::BatchSampler* sampler,
                                                            DataParallel* data_parallel,
                                                            int num_threads);

  // Runs optimizer step `step` (0-based; AdamW's update number step + 1).
  // Errors: the sampler's and the model's; the communicator's (Unavailable,
  // DeadlineExceeded, Aborted: the generation is over); FailedPrecondition
  // for a non-finite loss or gradient norm (parameters are left unchanged).
  absl::StatusOr<StepResult> Run(Step step);

 private:
  StepRunner(const TrainingConfig& config, model::GptModel* model,
             const data::BatchSampler* sampler, DataParallel* data_parallel, int num_threads);

  const TrainingConfig config_;
  model::GptModel* const model_;
  const data::BatchSampler* const sampler_;
  DataParallel* const data_parallel_;
  const int num_threads_;
  const int micro_batches_per_rank_;
  std::vector<int32_t> inputs_;
  std::vector<int32_t> targets_;
  std::vector<float> accumulated_;  // used with more than one micro-batch per rank
  std::vector<float> m_;            // AdamW state for the own update range
  std::vector<float> v_;
  std::vector<DecayRange> decay_ranges_;
};

}  // namespace cohort::train
