#pragma once
// The cohort-data command, minus flag parsing (main.cc fills DataToolConfig
// from flags): validates the configuration, naming the offending flag, writes
// the shards, prints a summary to `out` and periodic progress to `err`.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace cohort::datatool {

struct DataToolConfig {
  // "text" or "synthetic".
  std::string command;
  std::string output_dir;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  // Replace existing train_/val_ shards in output_dir instead of refusing.
  bool overwrite = false;
  // text: the input files, in order.
  std::vector<std::string> inputs;
  // text: "byte" (one token per byte) or "gpt2" (GPT-2's BPE from
  // vocab_path, its encoder.json, and merges_path, its vocab.bpe).
  std::string tokenizer = "byte";
  std::string vocab_path;
  std::string merges_path;
  // synthetic: see MarkovSourceOptions; `tokens` counts train plus val.
  uint64_t seed = 1;
  int64_t tokens = 10'000'000;
  int vocab_size = 256;
  int alphabet = 16;
  int branching = 4;
  int order = 2;
  // Least time between two progress lines on `err`.
  absl::Duration progress_interval = absl::Seconds(2);
};

// Runs the command. Errors: InvalidArgument (message names the flag) for a
// bad configuration or malformed --vocab / --merges files; otherwise those of
// Gpt2Tokenizer::Load, WriteTextShards and WriteSyntheticShards.
absl::Status RunDataTool(const DataToolConfig& config, std::ostream& out, std::ostream& err);

}  // namespace cohort::datatool
