#include "tools/cohortctl/safetensors.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace cohort::cohortctl {

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (1 to 4), or 0 when
// the bytes there are not one (stray continuation bytes, overlongs,
// surrogates, code points above U+10FFFF, a truncated sequence).
size_t Utf8SequenceAt(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t code, min;
  if ((c & 0xE0) == 0xC0) {
    n = 2, code = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, code = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, code = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      // JSON text is UTF-8: a multi-byte character passes through, and a
      // byte that is not part of one becomes U+FFFD.
      const size_t n = Utf8SequenceAt(text, i);
      if (n == 0) {
        out += "\\ufffd";
      } else {
        out.append(text, i, n);
        i += n - 1;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

SafetensorsLayout PlanSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> entries;
  if (!metadata.empty()) {
    std::vector<std::string> fields;
    for (const auto& [key, value] : metadata) {
      fields.push_back(absl::StrCat(JsonString(key), ":", JsonString(value)));
    }
    entries.push_back(absl::StrCat("\"__metadata__\":{", absl::StrJoin(fields, ","), "}"));
  }
  std::vector<uint64_t> data_offsets;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    uint64_t bytes = 4;
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    entries.push_back(absl::StrCat(JsonString(t.name), ":{\"dtype\":\"F32\",\"shape\":[",
                                   absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset,
                                   ",", offset + bytes, "]}"));
    data_offsets.push_back(offset);
    offset += bytes;
  }
  std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  header.append((8 - header.size() % 8) % 8, ' ');
  SafetensorsLayout layout;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) layout.prefix.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  layout.prefix += header;
  for (uint64_t o : data_offsets) layout.file_offsets.push_back(layout.prefix.size() + o);
  layout.file_size = layout.prefix.size() + offset;
  return layout;
}

}  // namespace cohort::cohortctl
