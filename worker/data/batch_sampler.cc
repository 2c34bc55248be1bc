#include "worker/data/batch_sampler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/data/counter_rng.h"

namespace cohort::data {
namespace {

// Separates sampler keys from any other use of the same seed.
constexpr uint64_t kSamplerSalt = 0x73616d706c6572ULL;  // "sampler"

}  // namespace

absl::StatusOr<BatchSampler> BatchSampler::Create(const TokenDataset& dataset,
                                                  SamplerOptions options) {
  if (options.context_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: context_length must be >= 1, got ", options.context_length));
  }
  if (options.global_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: global_batch_size must be >= 1, got ", options.global_batch_size));
  }
  const int64_t window_tokens = int64_t{options.context_length} + 1;
  std::vector<int64_t> window_starts(1, 0);
  int64_t longest = 0;
  int longest_shard = -1;
  for (int i = 0; i < dataset.num_shards(); ++i) {
    const int64_t size = static_cast<int64_t>(dataset.shard(i).size());
    if (size > longest || longest_shard < 0) {
      longest = size;
      longest_shard = i;
    }
    // A shard of n tokens holds n - T windows of T + 1 tokens.
    const int64_t windows = size >= window_tokens ? size - window_tokens + 1 : 0;
    window_starts.push_back(window_starts.back() + windows);
  }
  if (window_starts.back() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler: no token shard holds context_length + 1 = ", window_tokens, " tokens",
        longest_shard < 0 ? std::string(" (the dataset has no shards)")
                          : absl::StrCat(" (the longest, ", dataset.shard_name(longest_shard),
                                         ", has ", longest, ")")));
  }
  if (options.max_token_id >= 0) {
    if (absl::Status s = dataset.CheckTokenIds(options.max_token_id, "token shard"); !s.ok()) {
      return s;
    }
  }
  return BatchSampler(&dataset, options, std::move(window_starts));
}

SampleLocation BatchSampler::Locate(Step step, int sample) const {
  CHECK(step.value() >= 0 && sample >= 0 && sample < options_.global_batch_size)
      << "step " << step << " sample " << sample;
  const uint64_t key =
      HashCounters(HashCounters(options_.seed, kSamplerSalt), static_cast<uint64_t>(step.value()),
                   static_cast<uint64_t>(sample));
  SplitMix64 rng(key);
  const int64_t window = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(total_windows())));
  // The shard whose window range [window_starts_[i], window_starts_[i+1])
  // holds `window`; empty shards have empty ranges and are never chosen.
  const auto it = std::upper_bound(window_starts_.begin(), window_starts_.end(), window);
  const int shard = static_cast<int>(it - window_starts_.begin()) - 1;
  return SampleLocation{.shard = shard,
                        .offset = window - window_starts_[static_cast<size_t>(shard)]};
}

absl::Status BatchSampler::Fill(Step step, int first_sample, int count, int32_t* inputs,
                                int32_t* targets) const {
  if (step.value() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: step must be >= 0, got ", step.value()));
  }
  if (count < 0 || first_sample < 0 ||
      int64_t{first_sample} + count > int64_t{options_.global_batch_size}) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: samples [", first_sample, ", ", int64_t{first_sample} + count,
                     ") are not inside the global batch [0, ", options_.global_batch_size, ")"));
  }
  if (count > 0 && (inputs == nullptr || targets == nullptr)) {
    return absl::InvalidArgumentError("sampler: inputs and targets must not be null");
  }
  const size_t t = static_cast<size_t>(options_.context_length);
  for (int i = 0; i < count; ++i) {
    const SampleLocation where = Locate(step, first_sample + i);
    const uint16_t* window = dataset_->shard(where.shard).data() + where.offset;
    int32_t* in = inputs + static_cast<size_t>(i) * t;
    int32_t* out = targets + static_cast<size_t>(i) * t;
    for (size_t k = 0; k < t; ++k) {
      in[k] = window[k];
      out[k] = window[k + 1];
    }
  }
  return absl::OkStatus();
}

}  // namespace cohort::data
