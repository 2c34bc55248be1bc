#pragma once
// GPT-2's pre-tokenizer: the split of text into the pieces that byte-level
// BPE then encodes one by one (worker/data/gpt2_tokenizer.h). GPT-2 splits
// with the `regex` module's findall of
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// This file reproduces that match for match without a regex engine, over
// UTF-8 bytes:
//   - \p{L} and \p{N} are the Unicode general categories L* and N* (ICU's,
//     of the Unicode version the installed ICU carries);
//   - \s is the Unicode White_Space property, which is what `regex` means by
//     \s in Unicode mode (unlike Python's `re`, it does not match
//     U+001C..U+001F);
//   - " ?" is U+0020 only, and the contractions are lower case ASCII;
//   - an invalid UTF-8 byte (GPT-2 never sees one: Python text is decoded)
//     is a one-byte character of none of the classes, like punctuation. A
//     byte is invalid when it does not start a well-formed sequence (Unicode
//     table 3-7: no overlong forms, surrogates or code points past U+10FFFF);
//     each byte of a broken sequence is its own character.
// The pieces concatenate to the text, so nothing is lost.
//
// Pure functions; thread-safe.

#include <cstddef>
#include <string_view>
#include <vector>

namespace cohort::data {

// Iterates over the pre-tokens of a text, in order, without copying.
class Gpt2PreTokenizer {
 public:
  explicit Gpt2PreTokenizer(std::string_view text) : text_(text) {}

  // Sets *piece to the next pre-token (never empty) and returns true; false
  // once the text is used up.
  bool Next(std::string_view* piece);

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

// All pre-tokens of `text`.
std::vector<std::string_view> Gpt2PreTokenize(std::string_view text);

// Where a long text may be cut into parts that are pre-tokenized (and so
// encoded) separately with the same result as the whole: the largest k,
// 0 < k < text.size(), such that for every continuation `rest` the
// pre-tokens of text + rest are those of text[0, k) followed by those of
// text[k, end) + rest. 0 if there is none.
//
// Such a k is a character boundary where the classes (letter, number, space,
// other) of the two characters differ, the first is not a space and the pair
// is not an apostrophe before a letter (a contraction): no alternative of
// the pattern matches across such a pair, and none that ends before it looks
// past it differently from the end of the text. The character after k must
// be complete, so a text cut mid-character by a read is handled.
size_t Gpt2SafeCut(std::string_view text);

}  // namespace cohort::data
