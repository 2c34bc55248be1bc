#include "common/safe_text.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cohort {

std::string Quoted(absl::string_view value, size_t max) {
  const bool show = value.size() <= max &&
                    std::all_of(value.begin(), value.end(), [](char c) { return absl::ascii_isprint(c); });
  if (show) return absl::StrCat("\"", value, "\"");
  return absl::StrCat("<", value.size(), " bytes, not shown>");
}

std::string LogSafe(absl::string_view value, size_t max) {
  std::string out;
  const absl::string_view shown = value.substr(0, max);
  for (char c : shown) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u >= 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    } else {
      out.push_back(c);
    }
  }
  if (value.size() > max) absl::StrAppend(&out, "...(", value.size(), " bytes)");
  return out;
}

}  // namespace cohort
