#pragma once
// The values that a 0 in a JobSpec field stands for (proto/cohort/v1/
// job.proto), and the engine limits a spec is checked against. Only
// NormalizeJobSpec (validator.h) applies the defaults: every entry point (the
// coordinator at submit and restore, the worker's TrainingConfigFromSpec,
// the tools and the tests' fixtures) reads the spec it returns.

#include <climits>
#include <cstdint>

#include "absl/time/time.h"
#include "cohort/v1/job.pb.h"

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

// model.width: the widest model the engine holds. Its kernels index the
// 4C x C MLP matrices with int, so 4 * C * C must fit in int32: C <= 23170.
inline constexpr int32_t kMaxModelWidth = 23170;
static_assert(int64_t{4} * kMaxModelWidth * kMaxModelWidth <= INT32_MAX &&
              int64_t{4} * (kMaxModelWidth + 1) * (kMaxModelWidth + 1) > INT32_MAX);

// data.validation: batches per validation, and the largest fraction of the
// training data that may be held out.
inline constexpr int32_t kDefaultValidationBatches = 4;
inline constexpr double kMaxHeldOutFraction = 0.5;
// Each validation is a forward pass over this many global batches at most.
inline constexpr int32_t kMaxValidationBatches = 10000;

// checkpoint.keep_last: committed checkpoints retained besides keep_every's.
inline constexpr int32_t kDefaultKeepLast = 3;

// elastic.optimizer_replicas: a mirror of each ZeRO-1 optimizer shard on the
// next data rank, so one lost rank per shard group is recovered from memory
// (clamped to the data degree: layout::OptimizerCopies).
inline constexpr int32_t kDefaultOptimizerReplicas = 2;
inline constexpr int32_t kMaxOptimizerReplicas = 8;
// elastic.wait_for_workers_seconds: how long a job waits for enough workers.
inline constexpr int32_t kDefaultWaitForWorkersSeconds = 600;

// elastic.wait_for_workers_seconds of a normalised spec, as a duration.
inline absl::Duration WaitForWorkers(const v1::JobSpec& spec) {
  return absl::Seconds(spec.elastic().wait_for_workers_seconds());
}

}  // namespace cohort
