#pragma once
// ShardSetWriter: cuts a stream of tokens into numbered llm.c shards
// <output_dir>/<prefix>_000000.bin, <prefix>_000001.bin, ... of shard_tokens
// tokens each (the last one shorter), each written atomically.
//
// Not thread-safe: one writer per producer.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cohort::datatool {

struct ShardSetOptions {
  std::string output_dir;
  // "train" or "val": the file name prefix.
  std::string prefix;
  // Tokens per shard, 1..INT32_MAX (the format's count is an int32).
  int64_t shard_tokens = 100'000'000;
  // Existing <prefix>_NNNNNN.bin files in output_dir would mix with the new
  // ones under a glob: when false Create refuses to run over them, when true
  // it deletes them first.
  bool replace_existing = false;
};

struct ShardSetSummary {
  std::vector<std::string> paths;
  std::vector<int64_t> shard_sizes;  // tokens per path
  int64_t tokens = 0;
};

class ShardSetWriter {
 public:
  // Creates output_dir if needed. Errors: InvalidArgument for an empty
  // output_dir or prefix or shard_tokens out of range; FailedPrecondition if
  // shards with this prefix exist and replace_existing is false; Internal if
  // the directory cannot be created or listed or an old shard removed.
  static absl::StatusOr<ShardSetWriter> Create(ShardSetOptions options);

  // Buffers `tokens`, writing every shard that fills up. Errors: those of
  // WriteTokenShard.
  absl::Status Append(std::span<const uint16_t> tokens);

  // Writes the last, partial shard. A set that received no tokens at all
  // still gets one empty shard, so the set's glob always matches something.
  // The writer must not be used afterwards.
  absl::StatusOr<ShardSetSummary> Finish();

  // Tokens appended so far.
  int64_t tokens() const { return summary_.tokens + static_cast<int64_t>(buffer_.size()); }

 private:
  explicit ShardSetWriter(ShardSetOptions options) : options_(std::move(options)) {}
  absl::Status WriteBuffer();

  ShardSetOptions options_;
  std::vector<uint16_t> buffer_;
  ShardSetSummary summary_;
};

// "<output_dir>/<prefix>_<index as 6 digits>.bin".
std::string ShardPath(const std::string& output_dir, const std::string& prefix, int index);

}  // namespace cohort::datatool
