#include "tools/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace cohort::sample {
namespace {

// A uniform double in [0, 1) from the top 53 bits of one draw: every value
// is a multiple of 2^-53, exactly representable, never 1.
double UniformUnit(data::SplitMix64& rng) {
  return static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;
}

int32_t Greedy(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: the lowest id wins a tie
  }
  return static_cast<int32_t>(best);
}

}  // namespace

int CandidateCount(const SampleOptions& options, int vocab_size) {
  return options.vocab_limit == 0 ? vocab_size : options.vocab_limit;
}

absl::Status ValidateSampleOptions(const SampleOptions& options, int vocab_size) {
  if (options.tokens < 1 || options.tokens > kMaxSampleTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens must be in [1, ", kMaxSampleTokens, "], not ", options.tokens));
  }
  if (!std::isfinite(options.temperature) || options.temperature < 0 ||
      options.temperature > kMaxTemperature) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be 0 (greedy) or a number in (0, ", kMaxTemperature,
                     "], not ", options.temperature));
  }
  if (options.vocab_limit < 0 || options.vocab_limit > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_limit must be in [0, ", vocab_size,
                                                   "] (the model's vocabulary; 0: all of it), not ",
                                                   options.vocab_limit));
  }
  const int candidates = CandidateCount(options, vocab_size);
  if (options.top_k < 0 || options.top_k > candidates) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_k must be in [0, ", candidates,
        "] (the tokens the tokenizer can decode; 0: all of them), not ", options.top_k));
  }
  return absl::OkStatus();
}

int32_t PickToken(std::span<const float> logits, const SampleOptions& options,
                  data::SplitMix64& rng) {
  CHECK(!logits.empty()) << "PickToken needs at least one candidate";
  if (options.temperature == 0) return Greedy(logits);
  const size_t n = logits.size();
  const size_t k =
      options.top_k <= 0 || static_cast<size_t>(options.top_k) >= n ? n : options.top_k;
  // The candidates: all ids in id order, or the k largest logits (ties to
  // the lower id, so the set and its order do not depend on the sort).
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  if (k < n) {
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [&](int32_t a, int32_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    ids.resize(k);
  }
  float max_logit = logits[ids[0]];
  for (int32_t id : ids) max_logit = std::max(max_logit, logits[id]);
  // Unnormalised probabilities exp((l - max) / T): the largest is 1, so the
  // sum is in [1, k] and nothing overflows.
  std::vector<double> weights(ids.size());
  double total = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[ids[i]]) - max_logit) / options.temperature);
    total += weights[i];
  }
  const double target = UniformUnit(rng) * total;
  double cumulative = 0.0;
  int32_t last_possible = ids[0];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (weights[i] == 0.0) continue;  // underflowed: never drawn
    cumulative += weights[i];
    last_possible = ids[i];
    if (target < cumulative) return ids[i];
  }
  // Rounding left the target at the very top of the sum.
  return last_possible;
}

absl::StatusOr<std::vector<int32_t>> Generate(model::GptModel& model,
                                              std::span<const int32_t> prompt,
                                              const SampleOptions& options,
                                              const TokenObserver& observer) {
  const model::GptConfig& config = model.config();
  RETURN_IF_ERROR(ValidateSampleOptions(options, config.vocab_size));
  if (!model.layout().whole_model()) {
    return absl::InvalidArgumentError(
        "Generate needs a whole model, not a tensor- or pipeline-parallel shard");
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError("prompt is empty: generation starts from at least one token");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                     ", outside the model's vocabulary [0, ",
                                                     config.vocab_size, ")"));
    }
  }
  const int context_length = config.context_length;
  const size_t padded_vocab = static_cast<size_t>(config.PaddedVocab());
  const size_t candidates = static_cast<size_t>(CandidateCount(options, config.vocab_size));
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  tokens.reserve(prompt.size() + static_cast<size_t>(options.tokens));
  // The loss the forward pass computes needs targets; any valid ids do.
  const std::vector<int32_t> targets(static_cast<size_t>(context_length), 0);
  std::vector<float> logits;
  data::SplitMix64 rng(options.seed);
  for (int generated = 0; generated < options.tokens; ++generated) {
    // The model sees at most context_length positions: the newest ones.
    const int window = static_cast<int>(std::min<size_t>(tokens.size(), context_length));
    const int32_t* inputs = tokens.data() + (tokens.size() - static_cast<size_t>(window));
    RETURN_IF_ERROR(model.Forward(inputs, targets.data(), /*B=*/1, window).status());
    const size_t last_row = static_cast<size_t>(window - 1) * padded_vocab;
    logits.resize(model.logits().numel);
    if (logits.size() < last_row + padded_vocab) {
      return absl::InternalError(absl::StrCat("the model's logits hold ", logits.size(),
                                              " values, fewer than ", window, " rows of ",
                                              padded_vocab));
    }
    RETURN_IF_ERROR(model.CopyLogitsToHost(logits.data()));
    const std::span<const float> row(logits.data() + last_row, candidates);
    for (size_t id = 0; id < row.size(); ++id) {
      if (!std::isfinite(row[id])) {
        return absl::DataLossError(absl::StrCat(
            "the logit of token ", id, " is ", row[id], " after ", tokens.size(),
            " tokens: the weights do not give a finite model (a diverged or corrupt checkpoint)"));
      }
    }
    tokens.push_back(PickToken(row, options, rng));
    if (observer) observer(generated + 1);
  }
  return std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()),
                              tokens.end());
}

}  // namespace cohort::sample
