#include "common/json_reader.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace cohort {
namespace {

void AppendUtf8(uint32_t code, std::string* out) {
  if (code < 0x80) {
    out->push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code >> 6)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

bool IsHighSurrogate(uint32_t code) { return code >= 0xD800 && code <= 0xDBFF; }
bool IsLowSurrogate(uint32_t code) { return code >= 0xDC00 && code <= 0xDFFF; }

}  // namespace

void JsonReader::SkipSpace() {
  for (; pos_ < text_.size(); ++pos_) {
    const char c = text_[pos_];
    if (c == '\n') {
      ++line_;
    } else if (c != ' ' && c != '\t' && c != '\r') {
      break;
    }
  }
}

bool JsonReader::Consume(char c) {
  SkipSpace();
  if (Peek() != c || AtEnd()) return false;
  ++pos_;
  return true;
}

absl::Status JsonReader::Expect(char c) {
  if (!Consume(c)) return Error(absl::StrCat("expected '", absl::string_view(&c, 1), "'"));
  return absl::OkStatus();
}

absl::Status JsonReader::String(std::string* out) {
  SkipSpace();
  if (Peek() != '"') return Error("expected a string in double quotes");
  ++pos_;
  out->clear();
  while (true) {
    if (AtEnd()) return Error("unterminated string");
    const unsigned char c = static_cast<unsigned char>(text_[pos_++]);
    if (c == '"') return absl::OkStatus();
    if (c < 0x20) {
      return Error(absl::StrFormat("control character 0x%02x in a string (JSON escapes it)", c));
    }
    if (c != '\\') {
      out->push_back(static_cast<char>(c));
      continue;
    }
    if (AtEnd()) return Error("unterminated string");
    const char escape = text_[pos_++];
    switch (escape) {
      case '"':
      case '\\':
      case '/':
        out->push_back(escape);
        break;
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case 'n':
        out->push_back('\n');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'u': {
        uint32_t code = 0;
        if (!Hex4(&code)) return Error("\\u needs four hex digits");
        if (IsLowSurrogate(code)) {
          return Error(absl::StrFormat("unpaired low surrogate \\u%04X", code));
        }
        if (IsHighSurrogate(code)) {
          // A high surrogate must be followed at once by an escaped low one.
          uint32_t low = 0;
          const bool escape_follows = text_.substr(pos_, 2) == "\\u";
          if (escape_follows) pos_ += 2;
          if (!escape_follows || !Hex4(&low) || !IsLowSurrogate(low)) {
            return Error(absl::StrFormat("high surrogate \\u%04X without a low one", code));
          }
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        AppendUtf8(code, out);
        break;
      }
      default: {
        // The byte is echoed only when printable: an error message must not
        // carry a control byte of the file into a log line.
        const unsigned char e = static_cast<unsigned char>(escape);
        return Error(e >= 0x20 && e < 0x7F
                         ? absl::StrCat("unknown escape \\", absl::string_view(&escape, 1))
                         : absl::StrFormat("unknown escape: \\ and byte 0x%02x", e));
      }
    }
  }
}

bool JsonReader::Hex4(uint32_t* out) {
  if (pos_ + 4 > text_.size()) return false;
  uint32_t value = 0;
  for (size_t i = 0; i < 4; ++i) {
    const char h = text_[pos_ + i];
    const int digit = h >= '0' && h <= '9'   ? h - '0'
                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                             : -1;
    if (digit < 0) return false;
    value = value * 16 + static_cast<uint32_t>(digit);
  }
  pos_ += 4;
  *out = value;
  return true;
}

absl::Status JsonReader::Unsigned(uint64_t* out) {
  SkipSpace();
  const size_t begin = pos_;
  uint64_t value = 0;
  while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
    const uint64_t digit = static_cast<uint64_t>(Peek() - '0');
    if (value > (UINT64_MAX - digit) / 10) return Error("integer too large for 64 bits");
    value = value * 10 + digit;
    ++pos_;
  }
  if (pos_ == begin) return Error("expected a non-negative integer");
  if (pos_ - begin > 1 && text_[begin] == '0') return Error("integer with a leading 0");
  if (Peek() == '.' || Peek() == 'e' || Peek() == 'E') {
    return Error("expected an integer, not a fraction");
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status JsonReader::UnsignedArray(std::vector<uint64_t>* out) {
  RETURN_IF_ERROR(Expect('['));
  out->clear();
  if (Consume(']')) return absl::OkStatus();
  do {
    uint64_t v = 0;
    RETURN_IF_ERROR(Unsigned(&v));
    out->push_back(v);
  } while (Consume(','));
  return Expect(']');
}

absl::string_view JsonReader::NumberText() {
  SkipSpace();
  const size_t begin = pos_;
  // strchr finds the terminator too: a NUL byte is no number's.
  while (!AtEnd() && Peek() != '\0' && std::strchr("0123456789+-.eE", Peek()) != nullptr) ++pos_;
  return text_.substr(begin, pos_ - begin);
}

absl::Status JsonReader::Object(
    const std::function<absl::Status(const std::string& key)>& on_member) {
  RETURN_IF_ERROR(Expect('{'));
  if (Consume('}')) return absl::OkStatus();
  std::string key;
  do {
    RETURN_IF_ERROR(String(&key));
    RETURN_IF_ERROR(Expect(':'));
    RETURN_IF_ERROR(on_member(key));
  } while (Consume(','));
  return Expect('}');
}

absl::Status JsonReader::SkipValue(int depth) {
  if (depth > kMaxJsonSkipDepth) {
    return Error(absl::StrCat("values nested deeper than ", kMaxJsonSkipDepth));
  }
  SkipSpace();
  const char c = Peek();
  if (c == '"') {
    std::string ignored;
    return String(&ignored);
  }
  if (c == '{') {
    return Object([&](const std::string&) { return SkipValue(depth + 1); });
  }
  if (c == '[') {
    ++pos_;
    if (Consume(']')) return absl::OkStatus();
    do {
      RETURN_IF_ERROR(SkipValue(depth + 1));
    } while (Consume(','));
    return Expect(']');
  }
  for (absl::string_view word : {"true", "false", "null"}) {
    if (text_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return absl::OkStatus();
    }
  }
  if (NumberText().empty()) return Error("expected a value");
  return absl::OkStatus();
}

}  // namespace cohort
