#include "tools/data/text_shards.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string_view>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "worker/data/byte_tokenizer.h"
#include "worker/data/gpt2_pretokenizer.h"

namespace cohort::datatool {
namespace {

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

// Calls `fn` with consecutive chunks of every input, in order.
absl::Status ForEachChunk(const std::vector<std::string>& inputs, size_t chunk_bytes,
                          const std::function<absl::Status(std::string_view)>& fn) {
  std::string chunk(chunk_bytes, '\0');
  for (const std::string& path : inputs) {
    std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
    if (file == nullptr) {
      return absl::InternalError(
          absl::StrCat("cannot open input ", path, ": ", std::strerror(errno)));
    }
    while (true) {
      const size_t n = std::fread(chunk.data(), 1, chunk.size(), file.get());
      if (n > 0) {
        if (absl::Status s = fn(std::string_view(chunk.data(), n)); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat("input ", path, ": ", s.message()));
        }
      }
      if (n < chunk.size()) break;
    }
    if (std::ferror(file.get())) {
      return absl::InternalError(
          absl::StrCat("cannot read input ", path, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// Encodes a stream given in arbitrary chunks as GPT-2 would encode it whole:
// each Add encodes up to the last safe cut and keeps the rest.
class StreamingGpt2Encoder {
 public:
  StreamingGpt2Encoder(const data::Gpt2Tokenizer& tokenizer, size_t max_carry)
      : tokenizer_(tokenizer), max_carry_(max_carry) {}

  // Replaces *out with the tokens of the text that is safe to encode now.
  absl::Status Add(std::string_view text, std::vector<uint16_t>* out) {
    out->clear();
    carry_.append(text);
    size_t cut = data::Gpt2SafeCut(carry_);
    if (cut == 0 && carry_.size() >= max_carry_) {
      cut = ForcedCut(carry_);
      ++forced_cuts_;
    }
    if (cut == 0) return absl::OkStatus();
    if (absl::Status s = tokenizer_.EncodeAppend(std::string_view(carry_).substr(0, cut), out);
        !s.ok()) {
      return s;
    }
    carry_.erase(0, cut);
    return absl::OkStatus();
  }

  // Replaces *out with the tokens of the rest.
  absl::Status Finish(std::vector<uint16_t>* out) {
    out->clear();
    absl::Status s = tokenizer_.EncodeAppend(carry_, out);
    carry_.clear();
    return s;
  }

  int64_t forced_cuts() const { return forced_cuts_; }

 private:
  // Before the last byte, at most 3 back, that does not continue a UTF-8
  // sequence: a character the read cut short stays whole in the carry.
  static size_t ForcedCut(const std::string& text) {
    size_t cut = text.size() > 3 ? text.size() - 3 : text.size();
    for (int k = 0; k < 3 && cut > 1 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80;
         ++k) {
      --cut;
    }
    return cut;
  }

  const data::Gpt2Tokenizer& tokenizer_;
  const size_t max_carry_;
  std::string carry_;
  int64_t forced_cuts_ = 0;
};

// Runs the inputs through a fresh StreamingGpt2Encoder, calling `sink` with
// each batch of tokens and `on_bytes` with the bytes read so far.
absl::Status EncodeGpt2(const TextShardsOptions& options,
                        const std::function<absl::Status(std::span<const uint16_t>)>& sink,
                        const std::function<void(int64_t)>& on_bytes, int64_t* forced_cuts) {
  StreamingGpt2Encoder encoder(*options.gpt2, options.max_carry_bytes);
  std::vector<uint16_t> tokens;
  int64_t bytes = 0;
  absl::Status status =
      ForEachChunk(options.inputs, options.read_chunk_bytes, [&](std::string_view chunk) {
        if (absl::Status s = encoder.Add(chunk, &tokens); !s.ok()) return s;
        bytes += static_cast<int64_t>(chunk.size());
        on_bytes(bytes);
        return sink(tokens);
      });
  if (!status.ok()) return status;
  if (absl::Status s = encoder.Finish(&tokens); !s.ok()) return s;
  *forced_cuts = encoder.forced_cuts();
  return sink(tokens);
}

absl::StatusOr<TextShardsSummary> WriteGpt2Shards(const TextShardsOptions& options,
                                                  int64_t input_bytes) {
  const auto count_progress = [&](int64_t bytes) {
    if (options.count_progress) options.count_progress(bytes, input_bytes);
  };
  int64_t total = 0;
  TextShardsSummary summary{.input_bytes = input_bytes};
  absl::Status counted = EncodeGpt2(
      options,
      [&](std::span<const uint16_t> tokens) {
        total += static_cast<int64_t>(tokens.size());
        return absl::OkStatus();
      },
      count_progress, &summary.forced_cuts);
  if (!counted.ok()) return counted;
  absl::StatusOr<SplitWriter> writer =
      SplitWriter::Create({.output_dir = options.output_dir,
                           .total_tokens = total,
                           .val_fraction = options.val_fraction,
                           .shard_tokens = options.shard_tokens,
                           .replace_existing = options.replace_existing,
                           .progress = options.progress});
  if (!writer.ok()) return writer.status();
  int64_t forced_cuts = 0;
  absl::Status written = EncodeGpt2(
      options, [&](std::span<const uint16_t> tokens) { return writer->Append(tokens); },
      [](int64_t) {}, &forced_cuts);
  if (!written.ok()) return written;
  absl::StatusOr<SplitSummary> split = writer->Finish();
  if (!split.ok()) return split.status();
  summary.split = *std::move(split);
  return summary;
}

}  // namespace

absl::StatusOr<TextShardsSummary> WriteTextShards(const TextShardsOptions& options) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("no input files");
  if (options.read_chunk_bytes < 1 || options.max_carry_bytes < options.read_chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("read_chunk_bytes must be >= 1 and max_carry_bytes >= it, got ",
                     options.read_chunk_bytes, " and ", options.max_carry_bytes));
  }
  int64_t input_bytes = 0;
  for (const std::string& path : options.inputs) {
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(absl::StrCat("input ", path, " does not exist"));
    }
    if (ec) return absl::InternalError(absl::StrCat("input ", path, ": ", ec.message()));
    input_bytes += static_cast<int64_t>(size);
  }
  if (options.gpt2 != nullptr) return WriteGpt2Shards(options, input_bytes);

  // One token per byte, so the total, and with it the train/val cut, is known
  // before reading: the data streams through in chunks.
  absl::StatusOr<SplitWriter> writer =
      SplitWriter::Create({.output_dir = options.output_dir,
                           .total_tokens = input_bytes,
                           .val_fraction = options.val_fraction,
                           .shard_tokens = options.shard_tokens,
                           .replace_existing = options.replace_existing,
                           .progress = options.progress});
  if (!writer.ok()) return writer.status();
  std::vector<uint16_t> tokens;
  absl::Status status = ForEachChunk(options.inputs, size_t{1} << 20, [&](std::string_view chunk) {
    tokens.clear();
    data::ByteEncodeAppend(chunk, &tokens);
    return writer->Append(tokens);
  });
  if (!status.ok()) return status;
  absl::StatusOr<SplitSummary> split = writer->Finish();
  if (!split.ok()) return split.status();
  return TextShardsSummary{.split = *std::move(split), .input_bytes = input_bytes};
}

}  // namespace cohort::datatool
