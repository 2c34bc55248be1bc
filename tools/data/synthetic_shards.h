#pragma once
// The synthetic source (worker/data/markov_source.h) written as token shards:
// train_*.bin hold the first train tokens of stream kTrainStream, val_*.bin
// the first val tokens of stream kValStream, so a worker that generates the
// source in-process from the same options reproduces the files exactly.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "tools/data/split_writer.h"
#include "worker/data/markov_source.h"

namespace cohort::datatool {

struct SyntheticShardsOptions {
  data::MarkovSourceOptions source;
  // Tokens in all, train plus val, >= 0.
  int64_t tokens = 10'000'000;
  std::string output_dir;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  bool replace_existing = false;
  ProgressFn progress;  // may be empty
};

struct SyntheticShardsSummary {
  SplitSummary split;
  // ln(branching): see MarkovSource::EntropyFloorNats.
  double entropy_floor_nats = 0;
};

// Errors: those of MarkovSource::Create and SplitWriter.
absl::StatusOr<SyntheticShardsSummary> WriteSyntheticShards(const SyntheticShardsOptions& options);

}  // namespace cohort::datatool
