#include "worker/data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cohort::data {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token shards are mapped in place as little-endian uint16");

absl::Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

// Writes all of `bytes` to `fd`, retrying short writes and EINTR.
absl::Status WriteAll(int fd, const char* bytes, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot write", path, errno);
    }
    bytes += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

int32_t ReadLittleEndianInt32(const unsigned char* p) {
  const uint32_t value = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return static_cast<int32_t>(value);
}

absl::Status WriteShardFile(int fd, const std::string& tmp_path, std::span<const uint16_t> tokens) {
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  if (absl::Status s = WriteAll(fd, reinterpret_cast<const char*>(header.data()),
                                header.size() * sizeof(int32_t), tmp_path);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          WriteAll(fd, reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes(), tmp_path);
      !s.ok()) {
    return s;
  }
  // Durable before the rename makes it visible.
  if (::fsync(fd) != 0) return ErrnoStatus("cannot fsync", tmp_path, errno);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", path, ": ", tokens.size(), " tokens exceed the format's int32 token count"));
  }
  // Unique per process and call so concurrent writers never share a temporary file.
  static std::atomic<uint64_t> next_tmp_id{0};
  const std::string tmp_path =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", next_tmp_id.fetch_add(1));
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp_path, errno);
  absl::Status status = WriteShardFile(fd, tmp_path, tokens);
  if (::close(fd) != 0 && status.ok()) status = ErrnoStatus("cannot close", tmp_path, errno);
  if (status.ok() && ::rename(tmp_path.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(absl::StrCat("cannot rename ", tmp_path, " to"), path, errno);
  }
  if (!status.ok()) ::unlink(tmp_path.c_str());
  return status;
}

absl::StatusOr<TokenShard> TokenShard::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open token shard", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("cannot stat token shard", path, err);
  }
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("token shard ", path, ": file is ", file_bytes,
                                            " bytes, shorter than the ", kShardHeaderBytes,
                                            "-byte header"));
  }
  void* mapping = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // The mapping keeps the file referenced.
  if (mapping == MAP_FAILED) return ErrnoStatus("cannot mmap token shard", path, mmap_errno);
  // From here the destructor of `shard` unmaps on every error path.
  TokenShard shard(path, mapping, static_cast<size_t>(file_bytes));

  const auto* header = static_cast<const unsigned char*>(mapping);
  const int32_t magic = ReadLittleEndianInt32(header);
  const int32_t version = ReadLittleEndianInt32(header + 4);
  const int32_t count = ReadLittleEndianInt32(header + 8);
  if (magic != kShardMagic) {
    // The bytes found are not shown: the glob may match any file the
    // workers can read, and this message reaches the job's status.
    return absl::DataLossError(absl::StrCat("token shard ", path,
                                            ": not an llm.c token shard (its header does not "
                                            "start with the magic ", kShardMagic, ")"));
  }
  if (version != kShardVersion) {
    return absl::InvalidArgumentError(absl::StrCat("token shard ", path,
                                                   ": unsupported header field version ", version,
                                                   ", expected ", kShardVersion));
  }
  if (count < 0) {
    return absl::DataLossError(
        absl::StrCat("token shard ", path, ": header field token count is negative (", count, ")"));
  }
  const int64_t expected_bytes = kShardHeaderBytes + 2 * static_cast<int64_t>(count);
  if (file_bytes != expected_bytes) {
    return absl::DataLossError(
        absl::StrCat("token shard ", path, ": header field token count ", count,
                     " needs a file of ", expected_bytes, " bytes, but the file is ", file_bytes,
                     " bytes", file_bytes < expected_bytes ? " (truncated)" : " (trailing bytes)"));
  }
  shard.tokens_ = std::span<const uint16_t>(
      reinterpret_cast<const uint16_t*>(header + kShardHeaderBytes), static_cast<size_t>(count));
  return shard;
}

TokenShard::TokenShard(std::string path, void* mapping, size_t mapping_bytes)
    : path_(std::move(path)), mapping_(mapping), mapping_bytes_(mapping_bytes) {}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(std::exchange(other.mapping_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, {})) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, {});
  }
  return *this;
}

TokenShard::~TokenShard() { Unmap(); }

void TokenShard::Unmap() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
  mapping_bytes_ = 0;
  tokens_ = {};
}

}  // namespace cohort::data
