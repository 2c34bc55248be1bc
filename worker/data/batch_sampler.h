#pragma once
// BatchSampler: the data side of the determinism contract (docs/architecture.md, "Training engine"). The
// samples of step s are chosen from (seed, s) alone, never from the layout:
//
//   sample j of step s (0 <= j < global_batch_size) is the window of
//   context_length + 1 consecutive tokens starting at global window index
//   u = UniformBelow(total_windows, key = hash(seed, s, j)),
//
// where the global window index enumerates every valid window start of every
// shard in dataset order (a shard of n tokens has n - context_length starts;
// shorter shards have none and are skipped), so each start of the whole
// dataset is equally likely and shards are weighted by their window count.
// Windows never cross shard boundaries. Samples are drawn with replacement,
// independently per step: there are no epochs, so nothing depends on how
// many steps ran before or on who asked.
//
// inputs = window[0, T), targets = window[1, T] (T = context_length).
//
// The sampler knows nothing about data parallelism: a rank that owns samples
// [r*B/dp, (r+1)*B/dp) asks for exactly those with Fill(step, r*B/dp, B/dp,
// ...), and the concatenation over ranks equals a single Fill of all B.
//
// Thread-safe: immutable after Create; Fill may run concurrently. The sampler
// keeps a pointer to the dataset, which must outlive it and stay where it is
// (not be moved from).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ids.h"
#include "worker/data/token_dataset.h"

namespace cohort::data {

struct SamplerOptions {
  // The data seed (JobSpec data.seed).
  uint64_t seed = 0;
  // T: tokens per input sequence, >= 1.
  int context_length = 0;
  // B: samples per step over the whole data-parallel group, >= 1.
  int global_batch_size = 0;
  // When >= 0, Create checks every token id is <= max_token_id (pass the
  // model's vocab_size - 1) and fails otherwise. -1 skips the check (it scans
  // the whole dataset once).
  int max_token_id = -1;
};

// Where a sample's window starts.
struct SampleLocation {
  int shard = 0;
  int64_t offset = 0;  // token index inside the shard
  friend bool operator==(const SampleLocation&, const SampleLocation&) = default;
};

class BatchSampler {
 public:
  // Errors (InvalidArgument): context_length or global_batch_size < 1; no
  // shard holds context_length + 1 tokens (the message names the longest
  // shard); max_token_id >= 0 and some token id exceeds it (names the shard,
  // offset and id).
  static absl::StatusOr<BatchSampler> Create(const TokenDataset& dataset, SamplerOptions options);

  // Writes samples [first_sample, first_sample + count) of `step`:
  // inputs[i*T + t] and targets[i*T + t] for sample first_sample + i, each
  // buffer count * T int32 values. InvalidArgument if step < 0, count < 0,
  // the range leaves [0, global_batch_size), or a buffer is null while
  // count > 0; nothing is written then.
  absl::Status Fill(Step step, int first_sample, int count, int32_t* inputs,
                    int32_t* targets) const;

  // The window of sample j of `step` (0 <= j < global_batch_size, step >= 0;
  // not checked beyond a CHECK). For tests and debugging.
  SampleLocation Locate(Step step, int sample) const;

  const SamplerOptions& options() const { return options_; }
  // Number of valid window starts over the whole dataset.
  int64_t total_windows() const { return window_starts_.back(); }

 private:
  BatchSampler(const TokenDataset* dataset, SamplerOptions options,
               std::vector<int64_t> window_starts)
      : dataset_(dataset), options_(options), window_starts_(std::move(window_starts)) {}

  const TokenDataset* dataset_;
  SamplerOptions options_;
  // window_starts_[i] = windows in shards [0, i); size num_shards + 1.
  std::vector<int64_t> window_starts_;
};

}  // namespace cohort::data
