#pragma once
// SampleTokenizer: text <-> token ids for cohort-sample, over the tokenizers
// of the data layer: the byte tokenizer (worker/data/byte_tokenizer.h, ids
// 0..255) or GPT-2's byte-level BPE (worker/data/gpt2_tokenizer.h, from
// encoder.json and vocab.bpe). Both are lossless, and decoding a sequence
// equals decoding its tokens one by one and joining the bytes (a partial
// UTF-8 sequence stays bytes).
//
// Thread-safety: immutable after Load; safe to share.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cohort::sample {

enum class TokenizerKind { kByte, kGpt2 };

// "byte" or "gpt2"; InvalidArgument naming --tokenizer otherwise.
absl::StatusOr<TokenizerKind> ParseTokenizerKind(absl::string_view text);

struct TokenizerOptions {
  TokenizerKind kind = TokenizerKind::kByte;
  // GPT-2's files (gpt2 only; both required there, refused for byte).
  std::string encoder_json;  // --vocab: encoder.json, token -> id
  std::string merges;        // --merges: vocab.bpe, the merge ranks
};

class SampleTokenizer {
 public:
  // InvalidArgument for GPT-2 files given to the byte tokenizer or missing
  // for gpt2 (naming --vocab / --merges); the GPT-2 loader's errors.
  static absl::StatusOr<std::unique_ptr<SampleTokenizer>> Load(const TokenizerOptions& options);

  virtual ~SampleTokenizer() = default;

  // "byte" or "gpt2".
  virtual absl::string_view name() const = 0;
  // Ids are in [0, vocab_size()).
  virtual int vocab_size() const = 0;
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const = 0;
  // InvalidArgument for an id outside [0, vocab_size()).
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const = 0;
};

}  // namespace cohort::sample
