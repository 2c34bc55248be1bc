#pragma once
// Token shards in llm.c's format (the files llm.c's dataloader reads):
//
//   header: 256 little-endian int32
//     [0] magic 20240520
//     [1] version 1
//     [2] token count n (>= 0)
//     [3..255] zero
//   body:   n little-endian uint16 token ids
//
// so a valid file is exactly 1024 + 2 * n bytes long. Only little-endian hosts
// are supported (the body is memory-mapped as uint16 in place).

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cohort::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Writes `tokens` as a shard at `path`, atomically: the data goes to a
// temporary file in the same directory, is fsync'ed, then renamed over
// `path`, so readers see the old file or the whole new one, never a prefix.
// Errors: InvalidArgument if there are more than INT32_MAX tokens; Internal
// (with the path and errno text) if the file cannot be written or renamed, in
// which case the temporary file is removed.
absl::Status WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens);

// A read-only memory-mapped shard. Move-only; unmaps on destruction.
// Thread-safe: immutable after Open, so concurrent reads need no locking.
class TokenShard {
 public:
  // Maps `path` and validates its header. Errors (each message names the
  // file and, for a bad header, the field and the value found):
  //   NotFound: the file does not exist.
  //   DataLoss: shorter than the header, wrong magic, negative token count, or
  //     the file size is not 1024 + 2 * count (truncated or trailing bytes).
  //   InvalidArgument: a version other than 1.
  //   Internal: open/fstat/mmap failed for another reason.
  static absl::StatusOr<TokenShard> Open(const std::string& path);

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  const std::string& path() const { return path_; }
  // The token ids; valid while this object lives.
  std::span<const uint16_t> tokens() const { return tokens_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  TokenShard(std::string path, void* mapping, size_t mapping_bytes);
  void Unmap();

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::span<const uint16_t> tokens_;
};

}  // namespace cohort::data
