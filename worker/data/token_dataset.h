#pragma once
// TokenDataset: an ordered list of token shards, either memory-mapped files
// (llm.c .bin, see token_shard.h) or token vectors held in memory (the
// synthetic source that workers generate in-process). Samplers index it by
// (shard, offset); a window never crosses a shard boundary.
//
// Thread-safe: immutable after construction. Movable; the token spans stay
// valid across moves (mappings and vector buffers do not move).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/token_shard.h"

namespace cohort::data {

class TokenDataset {
 public:
  // Opens every file matching the glob `pattern` (e.g. "dir/train_*.bin"),
  // in byte-wise sorted path order so every worker sees the same shard order.
  // Errors: NotFound if nothing matches; InvalidArgument for a malformed
  // pattern; any TokenShard::Open error of a matching file.
  static absl::StatusOr<TokenDataset> OpenGlob(std::string_view pattern);

  // Opens `paths` in the order given. Errors: InvalidArgument if empty; any
  // TokenShard::Open error.
  static absl::StatusOr<TokenDataset> OpenFiles(const std::vector<std::string>& paths);

  // One in-memory shard per vector, named "<name>[i]".
  static TokenDataset FromMemory(std::vector<std::vector<uint16_t>> shards,
                                 std::string_view name = "memory");
  // A single in-memory shard.
  static TokenDataset FromTokens(std::vector<uint16_t> tokens, std::string_view name = "memory");

  // Holds out the tail of `whole`: the last floor(total * fraction) tokens in
  // shard order (the cut may fall inside a shard) go to `held_out`, the rest
  // to `kept`, so that a sampler over `kept` never reads a held-out token.
  // Both share ownership of `whole`'s shards. InvalidArgument unless
  // 0 < fraction < 1.
  struct Split;
  static absl::StatusOr<Split> HoldOutTail(TokenDataset whole, double fraction);

  TokenDataset(TokenDataset&&) noexcept = default;
  TokenDataset& operator=(TokenDataset&&) noexcept = default;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int num_shards() const { return static_cast<int>(views_.size()); }
  // Tokens of shard i (0 <= i < num_shards()).
  std::span<const uint16_t> shard(int i) const { return views_[static_cast<size_t>(i)]; }
  // The file path, or "<name>[i]" for in-memory shards; for error messages.
  const std::string& shard_name(int i) const { return names_[static_cast<size_t>(i)]; }
  int64_t total_tokens() const;
  // The largest token id in the whole dataset (0 when it is empty). Scans
  // every token: O(total_tokens).
  uint16_t MaxTokenId() const;
  // OK when no token id exceeds `max_token_id`; else InvalidArgument naming
  // the first offender: "<kind> <shard name>: token <i> has id <id>, larger
  // than the model's largest id <max> (...)". O(total_tokens).
  absl::Status CheckTokenIds(int max_token_id, absl::string_view kind) const;

 private:
  TokenDataset() = default;

  // Set on the parts of a HoldOutTail: the dataset whose shards they view.
  std::shared_ptr<const TokenDataset> owner_;
  std::vector<std::unique_ptr<TokenShard>> files_;
  std::vector<std::vector<uint16_t>> memory_;
  std::vector<std::span<const uint16_t>> views_;
  std::vector<std::string> names_;
};

struct TokenDataset::Split {
  TokenDataset kept;
  TokenDataset held_out;
};

}  // namespace cohort::data
