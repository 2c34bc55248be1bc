#pragma once
// SafetensorsReader: reads tensors out of a safetensors file
// (https://huggingface.co/docs/safetensors) without loading the whole file:
//
//   u64 little-endian N | N bytes of JSON header | data
//
// The header maps each tensor's name to {"dtype", "shape", "data_offsets":
// [begin, end]} (byte offsets into the data) and may hold a "__metadata__"
// object of strings. Open() reads and checks only the header; values are read
// with pread when asked for, one tensor (or a part of one) at a time.
//
// The file is untrusted input (conventions: Crash policy): the header length
// is bounded (kMaxSafetensorsHeaderBytes, the format's own limit), the JSON
// is parsed with bounded nesting, and every tensor's offsets must lie inside
// the file, span exactly dtype size x shape bytes and overlap no other
// tensor's. A file that breaks any of that is DataLoss naming the file (and
// the tensor). Gaps between tensors are tolerated (nothing reads them).
//
// Thread-safety: immutable after Open(); reads use pread, so any number of
// threads may read at once.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cohort {

// The largest header Open() accepts, as the reference implementation does.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // as written: "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;  // () for a scalar
  uint64_t file_offset = 0;    // of the first byte, from the start of the file
  uint64_t bytes = 0;

  // Product of the shape (1 for a scalar).
  int64_t NumElements() const;
};

// What a header says, checked against a data section of `data_bytes` bytes.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in the order of their data
  std::map<std::string, std::string> metadata;
};

// Parses the JSON `header` of a file whose data section (what follows the
// header) is `data_bytes` long; file_offset is set as if the header were
// `header.size()` bytes after the 8-byte length. `file` names the file in
// errors. DataLoss for malformed JSON, a missing or mistyped field, an
// unknown dtype, an empty or duplicate name, or offsets outside the data, not matching
// the shape or overlapping another tensor's.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view header,
                                                         uint64_t data_bytes,
                                                         absl::string_view file);

// Bytes per element of a safetensors dtype, or 0 when it is not one.
int SafetensorsDTypeSize(absl::string_view dtype);

class SafetensorsReader {
 public:
  // Opens `path` and checks its header. NotFound or PermissionDenied (and
  // Internal for other I/O errors) naming the path when it cannot be read;
  // DataLoss as ParseSafetensorsHeader, or for a file shorter than its
  // header, or a header longer than kMaxSafetensorsHeaderBytes.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);

  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // In the order of their data.
  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // The tensor with this name, or nullptr.
  const SafetensorsEntry* Find(absl::string_view name) const;

  // Reads elements [first, first + count) of `tensor` (row-major) into `out`
  // as float32: F32 as stored, F16, BF16 and F64 converted (F64 rounds).
  // InvalidArgument naming the tensor for another dtype or a range outside
  // it; DataLoss when the file has become shorter; Internal for I/O errors.
  absl::Status ReadFloat32(const SafetensorsEntry& tensor, int64_t first, int64_t count,
                           float* out) const;
  // The whole tensor.
  absl::Status ReadFloat32(const SafetensorsEntry& tensor, float* out) const {
    return ReadFloat32(tensor, 0, tensor.NumElements(), out);
  }

 private:
  SafetensorsReader(std::string path, int fd, SafetensorsHeader header);

  const std::string path_;
  const int fd_;
  const SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> by_name_;  // index into header_.tensors
};

}  // namespace cohort
