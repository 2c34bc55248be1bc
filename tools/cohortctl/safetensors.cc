#include "tools/cohortctl/safetensors.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace cohort::cohortctl {

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
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
