#pragma once
// Text to token shards with the byte tokenizer (worker/data/byte_tokenizer.h):
// the input files are read in order, as one stream of bytes, one token per
// byte; the tail val_fraction of that stream becomes the val set.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/data/split_writer.h"

namespace cohort::datatool {

struct TextShardsOptions {
  std::vector<std::string> inputs;
  std::string output_dir;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  bool replace_existing = false;
  ProgressFn progress;  // may be empty
};

// Writes train_*.bin (and val_*.bin when val_fraction > 0) into output_dir.
// Errors: InvalidArgument if inputs is empty; NotFound naming a missing input;
// Internal for unreadable inputs; FailedPrecondition if an input changes size
// while being read; those of SplitWriter.
absl::StatusOr<SplitSummary> WriteTextShards(const TextShardsOptions& options);

}  // namespace cohort::datatool
