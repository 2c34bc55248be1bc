#pragma once
// ValidationSampler: the held-out batches a job measures its validation loss
// on. Unlike training samples (BatchSampler: random windows per step) they
// are fixed: the held-out data is cut into consecutive windows of
// context_length + 1 tokens that overlap by one token (inputs of window k
// are tokens [kT, kT + T) of its shard, targets shifted by one), windows
// never cross a shard boundary, and sample j of validation batch b is window
// b * global_batch_size + j in dataset order. Every validation of a job
// therefore sees the same sequences, so the curve compares like with like,
// and a rank's share is a slice of a batch exactly as in training.
//
// Thread-safe: immutable after Create. Keeps a pointer to the dataset, which
// must outlive it and stay where it is.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/token_dataset.h"

namespace cohort::data {

struct ValidationSamplerOptions {
  int context_length = 0;     // T, >= 1
  int global_batch_size = 0;  // sequences per batch, >= 1
  int batches = 0;            // batches per validation, >= 1
  // As SamplerOptions::max_token_id: -1 skips the scan.
  int max_token_id = -1;
};

class ValidationSampler {
 public:
  // InvalidArgument (naming data.validation's fields) for sizes < 1, for
  // held-out data with fewer than batches * global_batch_size windows (the
  // message says how many it holds), or for a token id above max_token_id.
  static absl::StatusOr<ValidationSampler> Create(const TokenDataset& dataset,
                                                  ValidationSamplerOptions options);

  // Writes samples [first_sample, first_sample + count) of validation batch
  // `batch` as BatchSampler::Fill does. InvalidArgument for a batch or a
  // range out of bounds or null buffers with count > 0.
  absl::Status Fill(int batch, int first_sample, int count, int32_t* inputs,
                    int32_t* targets) const;

  const ValidationSamplerOptions& options() const { return options_; }
  // Windows the held-out data holds (at least batches * global_batch_size).
  int64_t total_windows() const { return window_starts_.back(); }

 private:
  ValidationSampler(const TokenDataset* dataset, ValidationSamplerOptions options,
                    std::vector<int64_t> window_starts)
      : dataset_(dataset), options_(options), window_starts_(std::move(window_starts)) {}

  const TokenDataset* dataset_;
  ValidationSamplerOptions options_;
  std::vector<int64_t> window_starts_;  // windows in shards [0, i); size num_shards + 1
};

}  // namespace cohort::data
