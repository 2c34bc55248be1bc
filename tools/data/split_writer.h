#pragma once
// SplitWriter: writes a token stream of known length as a train shard set
// followed by a val shard set. The first total - val tokens go to
// train_NNNNNN.bin, the last val = round(total * val_fraction) tokens to
// val_NNNNNN.bin (no val set when val_fraction is 0).
//
// Not thread-safe: one writer per producer.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/data/shard_set_writer.h"

namespace cohort::datatool {

// Called after every Append with the tokens written so far and the total.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct SplitOptions {
  std::string output_dir;
  // Tokens that will be appended in all, >= 0.
  int64_t total_tokens = 0;
  // In [0, 1).
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  // See ShardSetOptions::replace_existing.
  bool replace_existing = false;
  ProgressFn progress;  // may be empty
};

struct SplitSummary {
  ShardSetSummary train;
  std::optional<ShardSetSummary> val;  // absent when val_fraction is 0
};

class SplitWriter {
 public:
  // Errors: InvalidArgument for total_tokens < 0 or val_fraction outside
  // [0, 1); those of ShardSetWriter::Create.
  static absl::StatusOr<SplitWriter> Create(SplitOptions options);

  int64_t train_tokens() const { return train_tokens_; }
  int64_t val_tokens() const { return options_.total_tokens - train_tokens_; }

  // Routes `tokens` to train, then val. FailedPrecondition if this would
  // exceed total_tokens (nothing is written then); write errors.
  absl::Status Append(std::span<const uint16_t> tokens);
  // Writes the last shards. FailedPrecondition if fewer than total_tokens
  // were appended. The writer must not be used afterwards.
  absl::StatusOr<SplitSummary> Finish();

 private:
  SplitWriter(SplitOptions options, int64_t train_tokens, ShardSetWriter train,
              std::optional<ShardSetWriter> val)
      : options_(std::move(options)),
        train_tokens_(train_tokens),
        train_(std::move(train)),
        val_(std::move(val)) {}

  SplitOptions options_;
  int64_t train_tokens_;
  int64_t done_ = 0;
  ShardSetWriter train_;
  std::optional<ShardSetWriter> val_;
};

}  // namespace cohort::datatool
