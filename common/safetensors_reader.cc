#include "common/safetensors_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_reader.h"
#include "common/safe_text.h"
#include "common/status_macros.h"

namespace cohort {
namespace {

// Values are read and converted through a buffer of this size, so a read of
// a half-precision tensor needs no second copy of it.
constexpr size_t kStagingBytes = size_t{1} << 20;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; reading it on this host needs byte swaps");

// A reader of the JSON the header is: one object of objects, strings and
// arrays of non-negative integers. Every error is DataLoss naming the file
// and the byte of the header where it was found.
JsonReader HeaderReader(absl::string_view header, absl::string_view file) {
  return JsonReader(header, [file](const JsonReader& json, absl::string_view reason) {
    return absl::DataLossError(absl::StrCat("safetensors file ", file, ": header, byte ",
                                            json.pos(), " of ", json.size(), ": ", reason));
  });
}

absl::Status TensorError(absl::string_view file, absl::string_view tensor, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("safetensors file ", file, ": tensor ", Quoted(tensor, 200), " ", what));
}

// One tensor's entry: {"dtype": .., "shape": [..], "data_offsets": [b, e]}
// (other keys skipped), checked against the data section.
absl::Status ParseEntry(JsonReader& json, uint64_t data_bytes, uint64_t data_start,
                        absl::string_view file, SafetensorsEntry* entry) {
  bool has_dtype = false, has_shape = false, has_offsets = false;
  std::vector<uint64_t> shape, offsets;
  RETURN_IF_ERROR(json.Object([&](const std::string& key) {
    if (key == "dtype") {
      has_dtype = true;
      return json.String(&entry->dtype);
    }
    if (key == "shape") {
      has_shape = true;
      return json.UnsignedArray(&shape);
    }
    if (key == "data_offsets") {
      has_offsets = true;
      return json.UnsignedArray(&offsets);
    }
    return json.SkipValue();
  }));
  if (!has_dtype || !has_shape || !has_offsets) {
    return TensorError(file, entry->name,
                       absl::StrCat("lacks \"",
                                    !has_dtype   ? "dtype"
                                    : !has_shape ? "shape"
                                                 : "data_offsets",
                                    "\""));
  }
  const int element = SafetensorsDTypeSize(entry->dtype);
  if (element == 0) {
    return TensorError(file, entry->name,
                       absl::StrCat("has an unknown dtype ", Quoted(entry->dtype)));
  }
  if (offsets.size() != 2) {
    return TensorError(file, entry->name, "has data_offsets that are not [begin, end]");
  }
  uint64_t bytes = static_cast<uint64_t>(element);
  for (uint64_t d : shape) {
    if (d > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(bytes, d, &bytes)) {
      return TensorError(file, entry->name, "has a shape too large to address");
    }
    entry->shape.push_back(static_cast<int64_t>(d));
  }
  const uint64_t begin = offsets[0], end = offsets[1];
  if (begin > end || end > data_bytes) {
    return TensorError(file, entry->name,
                       absl::StrCat("has data_offsets [", begin, ", ", end,
                                    "] outside the data section of ", data_bytes, " bytes"));
  }
  if (end - begin != bytes) {
    return TensorError(file, entry->name,
                       absl::StrCat("spans ", end - begin, " bytes but ", entry->dtype, " [",
                                    absl::StrJoin(entry->shape, ", "), "] takes ", bytes));
  }
  entry->file_offset = data_start + begin;
  entry->bytes = bytes;
  return absl::OkStatus();
}

// Reads all of [offset, offset + n) of `fd`; `what` names the part in errors.
absl::Status PreadAll(int fd, const std::string& path, uint64_t offset, size_t n, char* out,
                      absl::string_view what) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("cannot read ", path, " at byte ", offset, " (", what,
                                              "): ", std::strerror(errno)));
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat("safetensors file ", path, " ends at byte ", offset,
                                              ", inside ", what,
                                              " (did it shrink after it was opened?)"));
    }
    out += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa x 2^-24, exact in float.
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
}

}  // namespace

int64_t SafetensorsEntry::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int SafetensorsDTypeSize(absl::string_view dtype) {
  static constexpr std::pair<absl::string_view, int> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
  };
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view header,
                                                         uint64_t data_bytes,
                                                         absl::string_view file) {
  JsonReader json = HeaderReader(header, file);
  SafetensorsHeader out;
  bool has_metadata = false;
  const uint64_t data_start = 8 + header.size();
  std::map<std::string, size_t, std::less<>> seen;
  RETURN_IF_ERROR(json.Object([&](const std::string& key) -> absl::Status {
    if (key == "__metadata__") {
      if (has_metadata) return json.Error("two __metadata__ objects");
      has_metadata = true;
      return json.Object([&](const std::string& name) -> absl::Status {
        std::string value;
        RETURN_IF_ERROR(json.String(&value));
        if (!out.metadata.emplace(name, std::move(value)).second) {
          return json.Error(absl::StrCat("metadata key ", Quoted(name), " twice"));
        }
        return absl::OkStatus();
      });
    }
    // No writer names a tensor "", and no reader could ask for it.
    if (key.empty()) return json.Error("a tensor with an empty name");
    if (!seen.emplace(key, out.tensors.size()).second) {
      return TensorError(file, key, "appears twice in the header");
    }
    SafetensorsEntry entry;
    entry.name = key;
    RETURN_IF_ERROR(ParseEntry(json, data_bytes, data_start, file, &entry));
    out.tensors.push_back(std::move(entry));
    return absl::OkStatus();
  }));
  json.SkipSpace();
  if (!json.AtEnd()) return json.Error("bytes after its object");

  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.file_offset < b.file_offset ||
                            (a.file_offset == b.file_offset && a.bytes < b.bytes);
                   });
  for (size_t i = 1; i < out.tensors.size(); ++i) {
    const SafetensorsEntry& before = out.tensors[i - 1];
    const SafetensorsEntry& t = out.tensors[i];
    if (t.file_offset < before.file_offset + before.bytes) {
      return TensorError(
          file, t.name,
          absl::StrCat("overlaps tensor ", Quoted(before.name, 200), " in the data section"));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string message = absl::StrCat("cannot open ", path, ": ", std::strerror(errno));
    if (errno == ENOENT) return absl::NotFoundError(message);
    if (errno == EACCES) return absl::PermissionDeniedError(message);
    return absl::InternalError(message);
  }
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return fail(
        absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno))));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file")));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return fail(absl::DataLossError(
        absl::StrCat("safetensors file ", path, " has ", size,
                     " bytes, fewer than the 8 of its header length: not a safetensors file")));
  }
  unsigned char length_bytes[8];
  if (absl::Status s =
          PreadAll(fd, path, 0, 8, reinterpret_cast<char*>(length_bytes), "the header length");
      !s.ok()) {
    return fail(s);
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[i];
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return fail(absl::DataLossError(absl::StrCat("safetensors file ", path, ": header length ",
                                                 header_bytes, " exceeds the format's limit of ",
                                                 kMaxSafetensorsHeaderBytes, " bytes")));
  }
  if (header_bytes > size - 8) {
    return fail(absl::DataLossError(absl::StrCat("safetensors file ", path, ": header of ",
                                                 header_bytes, " bytes runs past the end of the ",
                                                 size, "-byte file (truncated?)")));
  }
  std::string header(header_bytes, '\0');
  if (absl::Status s = PreadAll(fd, path, 8, header.size(), header.data(), "the header"); !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<SafetensorsHeader> parsed =
      ParseSafetensorsHeader(header, size - 8 - header_bytes, path);
  if (!parsed.ok()) return fail(parsed.status());
  return std::unique_ptr<SafetensorsReader>(new SafetensorsReader(path, fd, *std::move(parsed)));
}

SafetensorsReader::SafetensorsReader(std::string path, int fd, SafetensorsHeader header)
    : path_(std::move(path)), fd_(fd), header_(std::move(header)) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) by_name_.emplace(header_.tensors[i].name, i);
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsReader::Find(absl::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

absl::Status SafetensorsReader::ReadFloat32(const SafetensorsEntry& tensor, int64_t first,
                                            int64_t count, float* out) const {
  const int64_t numel = tensor.NumElements();
  if (first < 0 || count < 0 || first > numel || count > numel - first) {
    return absl::InvalidArgumentError(absl::StrCat("elements [", first, ", ", first + count,
                                                   ") of tensor ", Quoted(tensor.name, 200), " in ",
                                                   path_, ": it has ", numel));
  }
  const int element = SafetensorsDTypeSize(tensor.dtype);
  const bool convertible = tensor.dtype == "F32" || tensor.dtype == "F16" ||
                           tensor.dtype == "BF16" || tensor.dtype == "F64";
  if (!convertible) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quoted(tensor.name, 200), " in ", path_, " is ", tensor.dtype,
                     "; only F32, F16, BF16 and F64 read as float32"));
  }
  const uint64_t begin = tensor.file_offset + static_cast<uint64_t>(first) * element;
  const std::string what = absl::StrCat("tensor ", Quoted(tensor.name, 200));
  if (tensor.dtype == "F32") {
    return PreadAll(fd_, path_, begin, static_cast<size_t>(count) * sizeof(float),
                    reinterpret_cast<char*>(out), what);
  }
  std::vector<char> staging(std::min<size_t>(kStagingBytes, static_cast<size_t>(count) * element));
  const size_t per_block = staging.size() / static_cast<size_t>(element);
  for (int64_t done = 0; done < count;) {
    const size_t n = std::min<size_t>(per_block, static_cast<size_t>(count - done));
    RETURN_IF_ERROR(PreadAll(fd_, path_, begin + static_cast<uint64_t>(done) * element, n * element,
                             staging.data(), what));
    float* dst = out + done;
    for (size_t i = 0; i < n; ++i) {
      const char* src = staging.data() + i * element;
      if (element == 2) {
        uint16_t bits;
        std::memcpy(&bits, src, 2);
        // BF16 is the top half of a float32.
        dst[i] = tensor.dtype == "BF16" ? std::bit_cast<float>(static_cast<uint32_t>(bits) << 16)
                                        : HalfToFloat(bits);
      } else {
        double value;
        std::memcpy(&value, src, 8);
        // Beyond float's range the conversion is undefined; IEEE rounding
        // would give infinity.
        constexpr float kInf = std::numeric_limits<float>::infinity();
        dst[i] = std::isfinite(value) && std::abs(value) > std::numeric_limits<float>::max()
                     ? (std::signbit(value) ? -kInf : kInf)
                     : static_cast<float>(value);
      }
    }
    done += static_cast<int64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace cohort
