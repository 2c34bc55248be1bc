#pragma once
// The byte-level tokenizer: each byte of the text is one token, id 0..255.
// Lossless for any input (UTF-8 or not), vocabulary 256, no merges: the
// simplest tokenizer that lets a tiny GPT train on real text.
//
// Pure functions; thread-safe.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cohort::data {

inline constexpr int kByteVocabSize = 256;

// Token ids of `text`, one per byte.
std::vector<uint16_t> ByteEncode(std::string_view text);
// Appends the token ids of `text` to `out`.
void ByteEncodeAppend(std::string_view text, std::vector<uint16_t>* out);

// The bytes of `tokens`. InvalidArgument (naming the position and id) if a
// token is >= 256, i.e. did not come from the byte tokenizer.
absl::StatusOr<std::string> ByteDecode(std::span<const uint16_t> tokens);

}  // namespace cohort::data
