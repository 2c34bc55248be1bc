#include "worker/data/gpt2_pretokenizer.h"

#include <unicode/uchar.h>

#include <array>
#include <cstdint>

namespace cohort::data {
namespace {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

struct Char {
  size_t length = 1;  // bytes, 1..4
  CharClass cls = CharClass::kOther;
  // False for an invalid byte whose invalidity may depend on bytes past the
  // end of the text (a sequence the text cuts short).
  bool complete = true;
};

constexpr std::array<CharClass, 128> MakeAsciiClasses() {
  std::array<CharClass, 128> classes{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      classes[c] = CharClass::kLetter;
    } else if (c >= '0' && c <= '9') {
      classes[c] = CharClass::kNumber;
    } else if (c == ' ' || (c >= '\t' && c <= '\r')) {
      // White_Space in ASCII is exactly these six; U+001C..U+001F are not.
      classes[c] = CharClass::kSpace;
    } else {
      classes[c] = CharClass::kOther;
    }
  }
  return classes;
}
constexpr std::array<CharClass, 128> kAsciiClasses = MakeAsciiClasses();

CharClass ClassOf(UChar32 c) {
  if (u_isUWhiteSpace(c)) return CharClass::kSpace;
  const uint32_t mask = U_GET_GC_MASK(c);
  if ((mask & U_GC_L_MASK) != 0) return CharClass::kLetter;
  if ((mask & U_GC_N_MASK) != 0) return CharClass::kNumber;
  return CharClass::kOther;
}

bool InRange(std::string_view s, size_t i, unsigned lo, unsigned hi) {
  if (i >= s.size()) return false;
  const unsigned b = static_cast<unsigned char>(s[i]);
  return b >= lo && b <= hi;
}

// The character at s[i], i < s.size(). Well-formed sequences per Unicode
// table 3-7; anything else is one invalid byte, class other.
Char DecodeAt(std::string_view s, size_t i) {
  const unsigned b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return Char{.length = 1, .cls = kAsciiClasses[b0]};
  size_t length = 0;
  unsigned lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return Char{};  // a continuation byte, C0, C1 or F5..FF: never valid
  }
  bool valid = InRange(s, i + 1, lo, hi);
  for (size_t k = 2; valid && k < length; ++k) valid = InRange(s, i + k, 0x80, 0xBF);
  if (!valid) return Char{.complete = i + length <= s.size()};
  UChar32 c = static_cast<UChar32>(b0 & (0xFF >> (length + 1)));
  for (size_t k = 1; k < length; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return Char{.length = length, .cls = ClassOf(c)};
}

// End of the run of characters of class `cls` that starts at i.
size_t RunEnd(std::string_view s, size_t i, CharClass cls) {
  while (i < s.size()) {
    const Char c = DecodeAt(s, i);
    if (c.cls != cls) break;
    i += c.length;
  }
  return i;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at s[i], or 0.
size_t ContractionLength(std::string_view s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  switch (s[i + 1]) {
    case 's':
    case 't':
    case 'm':
    case 'd':
      return 2;
    case 'r':
    case 'v':
      return i + 2 < s.size() && s[i + 2] == 'e' ? 3 : 0;
    case 'l':
      return i + 2 < s.size() && s[i + 2] == 'l' ? 3 : 0;
    default:
      return 0;
  }
}

}  // namespace

bool Gpt2PreTokenizer::Next(std::string_view* piece) {
  const std::string_view s = text_;
  const size_t i = pos_;
  if (i >= s.size()) return false;
  size_t end = 0;
  const Char first = DecodeAt(s, i);
  // The class after a leading U+0020; kSpace stands for none.
  const CharClass after_space =
      s[i] == ' ' && i + 1 < s.size() ? DecodeAt(s, i + 1).cls : CharClass::kSpace;
  if (const size_t n = ContractionLength(s, i); n > 0) {
    end = i + n;
  } else if (after_space != CharClass::kSpace) {
    // " ?\p{L}+", " ?\p{N}+" or " ?[^\s\p{L}\p{N}]+" with the space.
    end = RunEnd(s, i + 1, after_space);
  } else if (first.cls != CharClass::kSpace) {
    end = RunEnd(s, i, first.cls);
  } else {
    // A run of spaces. "\s+(?!\S)" backtracks until the next character is a
    // space or the end: the run without its last character, unless the run
    // ends the text; a run of one before a non-space is "\s+".
    size_t last = i;
    end = i;
    while (end < s.size()) {
      const Char c = DecodeAt(s, end);
      if (c.cls != CharClass::kSpace) break;
      last = end;
      end += c.length;
    }
    if (end < s.size() && last > i) end = last;
  }
  *piece = s.substr(i, end - i);
  pos_ = end;
  return true;
}

std::vector<std::string_view> Gpt2PreTokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  Gpt2PreTokenizer splitter(text);
  std::string_view piece;
  while (splitter.Next(&piece)) pieces.push_back(piece);
  return pieces;
}

size_t Gpt2SafeCut(std::string_view text) {
  size_t cut = 0;
  CharClass prev = CharClass::kSpace;  // no cut before the first character
  bool prev_apostrophe = false;
  for (size_t i = 0; i < text.size();) {
    const Char c = DecodeAt(text, i);
    // From a sequence the text cuts short on, characters may change with more
    // text (its continuation bytes would join it).
    if (!c.complete) break;
    if (prev != CharClass::kSpace && prev != c.cls &&
        !(prev_apostrophe && c.cls == CharClass::kLetter)) {
      cut = i;
    }
    prev = c.cls;
    prev_apostrophe = text[i] == '\'';
    i += c.length;
  }
  return cut;
}

}  // namespace cohort::data
