#include "tools/data/data_tool.h"

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tools/data/split_writer.h"
#include "tools/data/synthetic_shards.h"
#include "tools/data/text_shards.h"
#include "worker/data/gpt2_tokenizer.h"

namespace cohort::datatool {
namespace {

absl::Status ValidateCommon(const DataToolConfig& config) {
  if (config.output_dir.empty()) {
    return absl::InvalidArgumentError("--output_dir is required: the directory for the shards");
  }
  if (!(config.val_fraction >= 0.0 && config.val_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--val_fraction must be in [0, 1), got ", config.val_fraction));
  }
  constexpr int64_t kMaxShard = std::numeric_limits<int32_t>::max();
  if (config.shard_tokens < 1 || config.shard_tokens > kMaxShard) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_tokens must be in [1, ", kMaxShard,
                     "] (the shard header counts tokens in an int32), got ", config.shard_tokens));
  }
  return absl::OkStatus();
}

absl::Status ValidateSynthetic(const DataToolConfig& config) {
  if (config.tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens must be >= 1, got ", config.tokens));
  }
  if (config.vocab_size < 1 || config.vocab_size > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab_size must be in [1, 65536] (token ids are uint16), got ", config.vocab_size));
  }
  if (config.alphabet < 1 || config.alphabet > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--alphabet must be in [1, --vocab_size=", config.vocab_size, "], got ", config.alphabet));
  }
  if (config.order != 1 && config.order != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--order must be 1 or 2, got ", config.order));
  }
  if (config.branching < 1 || config.branching > config.alphabet) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--branching must be in [1, --alphabet=", config.alphabet, "], got ", config.branching));
  }
  return absl::OkStatus();
}

// --tokenizer and its files: gpt2 needs both, the byte tokenizer and the
// synthetic source (which writes its own ids) take neither.
absl::Status ValidateTokenizer(const DataToolConfig& config) {
  if (config.tokenizer != "byte" && config.tokenizer != "gpt2") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer must be 'byte' or 'gpt2', got '", config.tokenizer, "'"));
  }
  if (config.command != "text" && config.tokenizer != "byte") {
    return absl::InvalidArgumentError(
        "--tokenizer applies to 'text' only: 'synthetic' writes its own ids");
  }
  const bool gpt2 = config.tokenizer == "gpt2";
  struct FileFlag {
    const char* flag;
    const std::string& value;
    const char* file;
  };
  for (const FileFlag& f : {FileFlag{"--vocab", config.vocab_path, "encoder.json"},
                            FileFlag{"--merges", config.merges_path, "vocab.bpe"}}) {
    if (gpt2 && f.value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.flag, " is required with --tokenizer gpt2: the path of GPT-2's ", f.file));
    }
    if (!gpt2 && !f.value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.flag, " is only for 'text' with --tokenizer gpt2 (got --tokenizer ", config.tokenizer,
          config.command == "text" ? "" : absl::StrCat(" and command '", config.command, "'"),
          ")"));
    }
  }
  return absl::OkStatus();
}

// Prints "cohort-data: 42.0% (4200000 / 10000000 tokens)" at most once per
// interval, so long runs show they are alive without flooding the terminal.
ProgressFn MakeProgress(std::ostream& err, absl::Duration interval, std::string unit) {
  auto last = std::make_shared<absl::Time>(absl::Now());
  return [&err, interval, last, unit = std::move(unit)](int64_t done, int64_t total) {
    const absl::Time now = absl::Now();
    if (now - *last < interval && done != total) return;
    *last = now;
    const double percent = total > 0 ? 100.0 * static_cast<double>(done) / total : 100.0;
    err << absl::StrFormat("cohort-data: %.1f%% (%d / %d %s)\n", percent, done, total, unit)
        << std::flush;
  };
}

void PrintSet(const char* name, const ShardSetSummary& set, std::ostream& out) {
  out << name << ": " << set.tokens << " tokens in " << set.paths.size() << " shard(s)\n";
  for (size_t i = 0; i < set.paths.size(); ++i) {
    out << "  " << set.paths[i] << "  " << set.shard_sizes[i] << " tokens\n";
  }
}

void PrintSplit(const SplitSummary& split, std::ostream& out) {
  PrintSet("train", split.train, out);
  if (split.val.has_value()) PrintSet("val", *split.val, out);
}

}  // namespace

absl::Status RunDataTool(const DataToolConfig& config, std::ostream& out, std::ostream& err) {
  if (config.command != "text" && config.command != "synthetic") {
    return absl::InvalidArgumentError(absl::StrCat(
        config.command.empty() ? std::string("no command given")
                               : absl::StrCat("unknown command '", config.command, "'"),
        ": expected 'text' or 'synthetic' (see --help)"));
  }
  if (absl::Status s = ValidateCommon(config); !s.ok()) return s;
  if (absl::Status s = ValidateTokenizer(config); !s.ok()) return s;
  const ProgressFn progress = MakeProgress(err, config.progress_interval, "tokens");

  if (config.command == "text") {
    if (config.inputs.empty()) {
      return absl::InvalidArgumentError(
          "--input is required for 'text': one or more text files, comma-separated");
    }
    std::optional<data::Gpt2Tokenizer> gpt2;
    if (config.tokenizer == "gpt2") {
      absl::StatusOr<data::Gpt2Tokenizer> loaded =
          data::Gpt2Tokenizer::Load(config.vocab_path, config.merges_path);
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(),
                            absl::StrCat("--tokenizer gpt2: ", loaded.status().message()));
      }
      gpt2 = *std::move(loaded);
    }
    absl::StatusOr<TextShardsSummary> summary =
        WriteTextShards({.inputs = config.inputs,
                         .output_dir = config.output_dir,
                         .val_fraction = config.val_fraction,
                         .shard_tokens = config.shard_tokens,
                         .replace_existing = config.overwrite,
                         .progress = progress,
                         .gpt2 = gpt2.has_value() ? &*gpt2 : nullptr,
                         .count_progress = MakeProgress(err, config.progress_interval,
                                                        "input bytes, counting tokens")});
    if (!summary.ok()) return summary.status();
    if (!gpt2.has_value()) {
      out << "byte tokenizer: vocab 256, one token per byte\n";
    } else {
      const int64_t tokens = summary->split.train.tokens +
                             (summary->split.val.has_value() ? summary->split.val->tokens : 0);
      out << absl::StrFormat(
          "gpt2 tokenizer: vocab %d (%s), %d merges; %d bytes in, %d tokens (%.2f bytes/token)\n",
          gpt2->vocab_size(), config.vocab_path, gpt2->num_merges(), summary->input_bytes, tokens,
          tokens > 0 ? static_cast<double>(summary->input_bytes) / static_cast<double>(tokens)
                     : 0.0);
      if (summary->forced_cuts > 0) {
        out << absl::StrFormat(
            "warning: %d place(s) with over 4 MiB of text and no safe cut were cut anyway; the "
            "ids there may differ from GPT-2's\n",
            summary->forced_cuts);
      }
    }
    PrintSplit(summary->split, out);
    return absl::OkStatus();
  }

  if (absl::Status s = ValidateSynthetic(config); !s.ok()) return s;
  absl::StatusOr<SyntheticShardsSummary> summary =
      WriteSyntheticShards({.source = {.seed = config.seed,
                                       .vocab_size = config.vocab_size,
                                       .alphabet_size = config.alphabet,
                                       .branching = config.branching,
                                       .order = config.order},
                            .tokens = config.tokens,
                            .output_dir = config.output_dir,
                            .val_fraction = config.val_fraction,
                            .shard_tokens = config.shard_tokens,
                            .replace_existing = config.overwrite,
                            .progress = progress});
  if (!summary.ok()) return summary.status();
  out << "synthetic order-" << config.order << " Markov source: seed " << config.seed << ", vocab_size "
      << config.vocab_size << ", alphabet " << config.alphabet << ", branching " << config.branching
      << "\n";
  PrintSplit(summary->split, out);
  out << absl::StrFormat("entropy floor: %.6f nats/token (ln %d)\n", summary->entropy_floor_nats,
                         config.branching);
  return absl::OkStatus();
}

}  // namespace cohort::datatool
