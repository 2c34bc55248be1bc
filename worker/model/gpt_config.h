#pragma once
// GptConfig: the shape of a GPT-2 style model (llm.c's GPT2Config).

#include "absl/status/status.h"
#include "common/job_spec/defaults.h"

namespace cohort::model {

struct GptConfig {
  int layers = 0;          // L, transformer blocks
  int heads = 0;           // NH, attention heads; must divide width
  int width = 0;           // C, channels
  int vocab_size = 0;      // V, real tokens (targets and inputs are < V)
  int context_length = 0;  // maxT, rows of the position embedding
  // Vp, rows of the token embedding. 0: vocab_size rounded up to a multiple of
  // kVocabPadMultiple (GPT-2: 50257 -> 50304). Otherwise >= vocab_size.
  int padded_vocab = 0;

  friend bool operator==(const GptConfig&, const GptConfig&) = default;

  static constexpr int kVocabPadMultiple = cohort::kVocabPadMultiple;

  // The Vp in effect: padded_vocab, or the rounded vocab_size when it is 0.
  int PaddedVocab() const;

  // OK, or InvalidArgument naming the first offending field: every size must
  // be positive, heads must divide width, padded_vocab must be 0 or at least
  // vocab_size, and the parameter count must fit in memory addressing.
  absl::Status Validate() const;
};

}  // namespace cohort::model
