#pragma once
// Text generation from a GptModel, one token at a time: the pure core of
// cohort-sample (no I/O; the weights come from checkpoint_weights.h).
//
// Each new token runs a full forward pass over the last min(length,
// context_length) tokens (no key/value cache: the model's forward keeps no
// state between calls) and picks the next token from the logits of the
// last position, over the ids below SampleOptions::vocab_limit (never the
// padding columns V..Vp-1).
//
// Picking (PickToken): temperature 0 is greedy (the largest logit, the
// lowest id among equal ones). Otherwise the top_k largest logits (0: all)
// become probabilities softmax(logit / temperature), computed in double,
// and one is drawn with a uniform from SplitMix64 (worker/data/counter_rng.h:
// no std:: distribution, whose output differs between standard libraries),
// so a seed gives the same tokens on every machine where the model's logits
// are the same bits.
//
// Thread-safety: pure functions; Generate uses the model it is given (one
// caller at a time, as GptModel wants).

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/counter_rng.h"
#include "worker/model/gpt_model.h"

namespace cohort::sample {

// The largest --temperature accepted: far past where the distribution is
// practically uniform, and small enough that logit / temperature stays a
// meaningful double.
inline constexpr double kMaxTemperature = 100.0;
// The most tokens one call generates: each costs a forward pass over up to
// context_length tokens, so more would run for days on a CPU.
inline constexpr int kMaxSampleTokens = 1'000'000;

struct SampleOptions {
  int tokens = 1;            // tokens to generate, in [1, kMaxSampleTokens]
  double temperature = 1.0;  // 0: greedy; else in (0, kMaxTemperature]
  int top_k = 0;             // sample among the k largest logits; 0: all candidates
  uint64_t seed = 1;         // of the SplitMix64 behind the draws
  // Candidate ids are [0, vocab_limit): a tokenizer smaller than the model's
  // vocabulary cannot decode the others. 0: the model's vocab_size.
  int vocab_limit = 0;
};

// OK, or InvalidArgument naming the field: tokens outside [1,
// kMaxSampleTokens], temperature negative,
// not finite or above kMaxTemperature, top_k negative or above the number
// of candidates, vocab_limit negative or above `vocab_size`.
absl::Status ValidateSampleOptions(const SampleOptions& options, int vocab_size);

// The candidates' count: vocab_limit, or vocab_size when it is 0.
int CandidateCount(const SampleOptions& options, int vocab_size);

// One token id in [0, logits.size()) from `logits` (one per candidate id,
// all finite; at least one), drawing from `rng` unless temperature is 0
// (greedy draws nothing). top_k above logits.size() means all of them.
int32_t PickToken(std::span<const float> logits, const SampleOptions& options,
                  data::SplitMix64& rng);

// Called after each generated token with the number generated so far.
using TokenObserver = std::function<void(int generated)>;

// Generates options.tokens tokens after `prompt` (at least one token, every
// id below the model's vocab_size) and returns them (the continuation only).
// `model` must be a whole model (no tensor or pipeline parallelism) whose
// Forward accepts B = 1. Errors: InvalidArgument for bad options (as
// ValidateSampleOptions), an empty prompt or an id out of range (naming its
// position); DataLoss when the logits are not finite (NaN or inf: weights
// that are not a trained model's); the model's errors.
absl::StatusOr<std::vector<int32_t>> Generate(model::GptModel& model,
                                              std::span<const int32_t> prompt,
                                              const SampleOptions& options,
                                              const TokenObserver& observer = nullptr);

}  // namespace cohort::sample
