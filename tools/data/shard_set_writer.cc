#include "tools/data/shard_set_writer.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/data/token_shard.h"

namespace cohort::datatool {
namespace {

namespace fs = std::filesystem;

// Whether `name` is "<prefix>_" + 6 digits + ".bin", the names ShardPath makes.
bool IsShardName(const std::string& name, const std::string& prefix) {
  const std::string head = prefix + "_";
  if (name.size() != head.size() + 6 + 4 || !absl::StartsWith(name, head) ||
      !absl::EndsWith(name, ".bin")) {
    return false;
  }
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(head.size()), name.end() - 4,
                     [](char c) { return absl::ascii_isdigit(c); });
}

}  // namespace

std::string ShardPath(const std::string& output_dir, const std::string& prefix, int index) {
  return (fs::path(output_dir) / absl::StrFormat("%s_%06d.bin", prefix, index)).string();
}

absl::StatusOr<ShardSetWriter> ShardSetWriter::Create(ShardSetOptions options) {
  if (options.output_dir.empty()) return absl::InvalidArgumentError("output_dir is empty");
  if (options.prefix.empty()) return absl::InvalidArgumentError("shard prefix is empty");
  if (options.shard_tokens < 1 || options.shard_tokens > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("shard_tokens must be in [1, ",
                                                   std::numeric_limits<int32_t>::max(), "], got ",
                                                   options.shard_tokens));
  }
  std::error_code ec;
  fs::create_directories(options.output_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create directory ", options.output_dir, ": ", ec.message()));
  }
  std::vector<fs::path> existing;
  for (fs::directory_iterator it(options.output_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (IsShardName(it->path().filename().string(), options.prefix)) existing.push_back(it->path());
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list directory ", options.output_dir, ": ", ec.message()));
  }
  if (!existing.empty() && !options.replace_existing) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.output_dir, " already holds ", existing.size(), " ", options.prefix,
        "_*.bin shard(s), which would mix with the new ones; remove them or pass --overwrite"));
  }
  for (const fs::path& path : existing) {
    if (!fs::remove(path, ec) && ec) {
      return absl::InternalError(absl::StrCat("cannot remove ", path.string(), ": ", ec.message()));
    }
  }
  return ShardSetWriter(std::move(options));
}

absl::Status ShardSetWriter::Append(std::span<const uint16_t> tokens) {
  const size_t capacity = static_cast<size_t>(options_.shard_tokens);
  while (!tokens.empty()) {
    const size_t take = std::min(capacity - buffer_.size(), tokens.size());
    buffer_.insert(buffer_.end(), tokens.begin(),
                   tokens.begin() + static_cast<std::ptrdiff_t>(take));
    tokens = tokens.subspan(take);
    if (buffer_.size() == capacity) {
      if (absl::Status s = WriteBuffer(); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardSetSummary> ShardSetWriter::Finish() {
  if (!buffer_.empty() || summary_.paths.empty()) {
    if (absl::Status s = WriteBuffer(); !s.ok()) return s;
  }
  return std::move(summary_);
}

absl::Status ShardSetWriter::WriteBuffer() {
  const std::string path =
      ShardPath(options_.output_dir, options_.prefix, static_cast<int>(summary_.paths.size()));
  if (absl::Status s = data::WriteTokenShard(path, buffer_); !s.ok()) return s;
  summary_.paths.push_back(path);
  summary_.shard_sizes.push_back(static_cast<int64_t>(buffer_.size()));
  summary_.tokens += static_cast<int64_t>(buffer_.size());
  buffer_.clear();
  return absl::OkStatus();
}

}  // namespace cohort::datatool
