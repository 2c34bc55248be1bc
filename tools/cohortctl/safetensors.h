#pragma once
// The safetensors file layout (https://huggingface.co/docs/safetensors):
//
//   u64 little-endian N | N bytes of JSON header | tensor bytes
//
// The header maps each tensor's name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets into the bytes after the header, in order, without
// gaps) plus an optional "__metadata__" object of strings. The header is
// padded with spaces to a multiple of 8 bytes so the data is aligned.
// Pure functions, thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cohort::cohortctl {

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;  // float32 elements
};

struct SafetensorsLayout {
  std::string prefix;                  // the u64 length and the padded header
  std::vector<uint64_t> file_offsets;  // where each tensor's bytes start in the file
  uint64_t file_size = 0;
};

// The layout for `tensors` (stored in this order, F32) and `metadata`.
SafetensorsLayout PlanSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata);

// `text` as a JSON string literal (quotes and escapes). Bytes that are not
// valid UTF-8 become U+FFFD, so the header is always valid JSON.
std::string JsonString(const std::string& text);

}  // namespace cohort::cohortctl
