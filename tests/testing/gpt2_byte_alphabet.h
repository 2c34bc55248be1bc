#pragma once
// GPT-2's byte alphabet (bytes_to_unicode in GPT-2's encoder.py), spelled
// out independently of worker/data/gpt2_tokenizer.cc so that the vocabulary
// files tests write do not depend on the code under test. Header-only.

#include <string>

namespace cohort::testing {

// The character that stands for byte `b` (0..255) in encoder.json and
// vocab.bpe, UTF-8: the printable bytes '!'..'~', 0xA1..0xAC and
// 0xAE..0xFF stand for themselves, the other 68, in order, for U+0100 on.
inline std::string Gpt2ByteChar(int b) {
  const auto printable = [](int c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
  };
  int code_point = b;
  if (!printable(b)) {
    code_point = 0x100;
    for (int c = 0; c < b; ++c) code_point += printable(c) ? 0 : 1;
  }
  if (code_point < 0x80) return std::string(1, static_cast<char>(code_point));
  // The alphabet ends at U+0143: two bytes at most.
  return {static_cast<char>(0xC0 | (code_point >> 6)),
          static_cast<char>(0x80 | (code_point & 0x3F))};
}

}  // namespace cohort::testing
