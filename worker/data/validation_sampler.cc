#include "worker/data/validation_sampler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cohort::data {

absl::StatusOr<ValidationSampler> ValidationSampler::Create(const TokenDataset& dataset,
                                                            ValidationSamplerOptions options) {
  if (options.context_length < 1 || options.global_batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "validation sampler: context_length ", options.context_length,
        " and global_batch_size ", options.global_batch_size, " must be >= 1"));
  }
  if (options.batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.validation.batches must be >= 1, got ", options.batches));
  }
  const int64_t T = options.context_length;
  std::vector<int64_t> window_starts(1, 0);
  for (int i = 0; i < dataset.num_shards(); ++i) {
    const int64_t size = static_cast<int64_t>(dataset.shard(i).size());
    // Window k reads tokens [kT, kT + T]: n tokens hold floor((n - 1) / T).
    window_starts.push_back(window_starts.back() + (size > 0 ? (size - 1) / T : 0));
  }
  const int64_t needed = int64_t{options.batches} * options.global_batch_size;
  if (window_starts.back() < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.validation: ", options.batches, " batches of ", options.global_batch_size,
        " sequences need ", needed, " held-out windows of ", T + 1, " tokens, but the held-out data (",
        dataset.total_tokens(), " tokens in ", dataset.num_shards(),
        " shards) holds ", window_starts.back(),
        "; lower data.validation.batches or hold out more data"));
  }
  if (options.max_token_id >= 0) {
    RETURN_IF_ERROR(dataset.CheckTokenIds(options.max_token_id, "validation shard"));
  }
  return ValidationSampler(&dataset, options, std::move(window_starts));
}

absl::Status ValidationSampler::Fill(int batch, int first_sample, int count, int32_t* inputs,
                                     int32_t* targets) const {
  if (batch < 0 || batch >= options_.batches || count < 0 || first_sample < 0 ||
      first_sample + count > options_.global_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "validation batch ", batch, " samples [", first_sample, ", ", first_sample + count,
        ") out of range (", options_.batches, " batches of ", options_.global_batch_size, ")"));
  }
  if (count > 0 && (inputs == nullptr || targets == nullptr)) {
    return absl::InvalidArgumentError("validation sampler: null buffer");
  }
  const int64_t T = options_.context_length;
  for (int i = 0; i < count; ++i) {
    const int64_t window = int64_t{batch} * options_.global_batch_size + first_sample + i;
    const int shard = static_cast<int>(
        std::upper_bound(window_starts_.begin(), window_starts_.end(), window) -
        window_starts_.begin() - 1);
    const uint16_t* tokens =
        dataset_->shard(shard).data() + (window - window_starts_[static_cast<size_t>(shard)]) * T;
    for (int64_t t = 0; t < T; ++t) {
      inputs[i * T + t] = tokens[t];
      targets[i * T + t] = tokens[t + 1];
    }
  }
  return absl::OkStatus();
}

}  // namespace cohort::data
