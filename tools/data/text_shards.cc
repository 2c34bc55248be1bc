#include "tools/data/text_shards.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "worker/data/byte_tokenizer.h"

namespace cohort::datatool {
namespace {

constexpr size_t kReadChunkBytes = 1 << 20;

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

absl::Status AppendFile(const std::string& path, SplitWriter* writer) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot open input ", path, ": ", std::strerror(errno)));
  }
  std::string chunk(kReadChunkBytes, '\0');
  std::vector<uint16_t> tokens;
  while (true) {
    const size_t n = std::fread(chunk.data(), 1, chunk.size(), file.get());
    if (n > 0) {
      tokens.clear();
      data::ByteEncodeAppend(std::string_view(chunk.data(), n), &tokens);
      if (absl::Status s = writer->Append(tokens); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("input ", path, ": ", s.message()));
      }
    }
    if (n < chunk.size()) break;
  }
  if (std::ferror(file.get())) {
    return absl::InternalError(
        absl::StrCat("cannot read input ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SplitSummary> WriteTextShards(const TextShardsOptions& options) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("no input files");
  // One token per byte, so the total, and with it the train/val cut, is known
  // before reading: the data streams through in chunks.
  int64_t total = 0;
  for (const std::string& path : options.inputs) {
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(absl::StrCat("input ", path, " does not exist"));
    }
    if (ec) return absl::InternalError(absl::StrCat("input ", path, ": ", ec.message()));
    total += static_cast<int64_t>(size);
  }
  absl::StatusOr<SplitWriter> writer =
      SplitWriter::Create({.output_dir = options.output_dir,
                           .total_tokens = total,
                           .val_fraction = options.val_fraction,
                           .shard_tokens = options.shard_tokens,
                           .replace_existing = options.replace_existing,
                           .progress = options.progress});
  if (!writer.ok()) return writer.status();
  for (const std::string& path : options.inputs) {
    if (absl::Status s = AppendFile(path, &*writer); !s.ok()) return s;
  }
  return writer->Finish();
}

}  // namespace cohort::datatool
