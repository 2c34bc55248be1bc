#include "worker/data/byte_tokenizer.h"

#include "absl/strings/str_cat.h"

namespace cohort::data {

std::vector<uint16_t> ByteEncode(std::string_view text) {
  std::vector<uint16_t> tokens;
  ByteEncodeAppend(text, &tokens);
  return tokens;
}

void ByteEncodeAppend(std::string_view text, std::vector<uint16_t>* out) {
  out->reserve(out->size() + text.size());
  // Through unsigned char: plain char may be signed, and bytes >= 0x80 must
  // map to 128..255, not to negative values.
  for (const char c : text) out->push_back(static_cast<unsigned char>(c));
}

absl::StatusOr<std::string> ByteDecode(std::span<const uint16_t> tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= kByteVocabSize) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " has id ", tokens[i],
                                                     ", outside the byte vocabulary [0, ",
                                                     kByteVocabSize, ")"));
    }
    text.push_back(static_cast<char>(static_cast<unsigned char>(tokens[i])));
  }
  return text;
}

}  // namespace cohort::data
