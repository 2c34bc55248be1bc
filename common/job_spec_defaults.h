#pragma once
// The values that a 0 in a JobSpec field stands for (proto/cohort/v1/
// job.proto). The coordinator fills them in when it normalises a spec
// (coordinator/job_spec_validator.cc); the worker applies the same ones to
// specs that skipped normalisation (worker/train/training_config.cc).

#include <cstdint>

namespace cohort {

inline constexpr double kDefaultBeta1 = 0.9;
inline constexpr double kDefaultBeta2 = 0.95;
inline constexpr double kDefaultEpsilon = 1e-8;

inline constexpr int32_t kDefaultBranching = 4;
// The alphabet is min(kDefaultAlphabet, model.vocab_size).
inline constexpr int32_t kDefaultAlphabet = 16;
inline constexpr int64_t kDefaultSyntheticTokens = 1000000;
inline constexpr int32_t kDefaultSyntheticOrder = 2;

// Workers pad the vocabulary (the token embedding's rows) to a multiple of
// this (GPT-2: 50257 -> 50304, llm.c's Vp); tensor parallelism splits the
// padded rows, so it must divide the padded size.
inline constexpr int kVocabPadMultiple = 128;

// checkpoint.keep_last: committed checkpoints retained besides keep_every's.
inline constexpr int32_t kDefaultKeepLast = 3;

}  // namespace cohort
