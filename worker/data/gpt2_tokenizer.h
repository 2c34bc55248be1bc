#pragma once
// Gpt2Tokenizer: GPT-2's byte-level BPE, with the files GPT-2 ships
// (encoder.json, vocab.bpe), giving GPT-2's ids for any text.
//
// Encoding: the text is split into pre-tokens (gpt2_pretokenizer.h); each
// pre-token's bytes start as one symbol per byte, and the adjacent pair of
// lowest merge rank is merged, every occurrence of it left to right, until
// no adjacent pair has a rank; the symbols' ids are the piece's tokens.
// Every byte string is encodable (the vocabulary holds all 256 bytes), so
// Decode(Encode(x)) == x for any bytes, UTF-8 or not.
//
// The files: encoder.json maps token strings to ids; a token string spells
// its bytes in GPT-2's byte alphabet (bytes_to_unicode in GPT-2's
// encoder.py: the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand
// for themselves, the other 68 bytes, in order, for U+0100..U+0143, so a
// space is "Ġ"). vocab.bpe holds the merges in rank order, one "a b" per
// line after an optional "#version" line. Load checks, naming file, line
// and reason:
//   - each file is at most kMaxGpt2FileBytes;
//   - encoder.json is one JSON object of string -> integer, ids in
//     [0, 65535] (shard tokens are uint16), each token and id once, and all
//     256 single bytes present;
//   - each merge's two parts and their concatenation are in encoder.json
//     (a merge that could never apply, or would make an id-less symbol,
//     means the two files do not belong together: refused), no merge twice,
//     at most kMaxGpt2Merges.
// Tokens no merge makes (such as "<|endoftext|>") are never produced by
// Encode; Decode spells them out like any other.
//
// Thread-safe: Encode's per-piece cache is behind a mutex.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cohort::data {

inline constexpr int64_t kMaxGpt2FileBytes = int64_t{64} << 20;
inline constexpr int kMaxGpt2Merges = 1 << 20;
// One Encode call's text; longer texts are encoded in parts (Gpt2SafeCut).
inline constexpr int64_t kMaxGpt2EncodeBytes = int64_t{1} << 30;

class Gpt2Tokenizer {
 public:
  // Reads the two files. Errors: NotFound for a missing file; Internal if
  // one cannot be read; InvalidArgument for a file over kMaxGpt2FileBytes
  // or a malformed entry (see above).
  static absl::StatusOr<Gpt2Tokenizer> Load(const std::string& encoder_json_path,
                                            const std::string& merges_path);
  // The same from the files' contents (errors name them "encoder.json" and
  // "vocab.bpe").
  static absl::StatusOr<Gpt2Tokenizer> FromContents(std::string_view encoder_json,
                                                    std::string_view merges);

  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer();

  // The largest id plus one (ids below it may be unused).
  int vocab_size() const { return static_cast<int>(id_to_bytes_.size()); }
  int num_merges() const { return num_merges_; }

  // Appends the ids of `text`. InvalidArgument for a text over
  // kMaxGpt2EncodeBytes (nothing is appended then).
  absl::Status EncodeAppend(std::string_view text, std::vector<uint16_t>* out) const;
  absl::StatusOr<std::vector<uint16_t>> Encode(std::string_view text) const;

  // The bytes of `ids`. InvalidArgument naming the position and the id for
  // an id that is not in the vocabulary.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const;
  absl::StatusOr<std::string> Decode(std::span<const uint16_t> ids) const;

 private:
  struct Merge {
    uint32_t rank;
    uint16_t id;  // of the merged symbol
  };
  struct Cache;

  Gpt2Tokenizer();
  // FromContents, with the names errors give the two files.
  static absl::StatusOr<Gpt2Tokenizer> Parse(std::string_view encoder_json,
                                             std::string_view encoder_name, std::string_view merges,
                                             std::string_view merges_name);
  // Appends the tokens of one pre-token.
  void EncodePiece(std::string_view piece, std::vector<uint16_t>* out) const;
  void Bpe(std::string_view piece, std::vector<uint16_t>* out) const;

  // Bytes of each id; empty for an unused id (no token is empty).
  std::vector<std::string> id_to_bytes_;
  uint16_t byte_ids_[256] = {};
  // Key: left id << 16 | right id.
  absl::flat_hash_map<uint32_t, Merge> merges_;
  int num_merges_ = 0;
  std::unique_ptr<Cache> cache_;
};

}  // namespace cohort::data
