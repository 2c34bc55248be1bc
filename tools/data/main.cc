// cohort-data: writes llm.c token shards for Cohort's training engine.
//
//   cohort-data text --input a.txt,b.txt --output_dir data/text
//       [--val_fraction 0.1] [--shard_tokens N] [--overwrite]
//       [--tokenizer gpt2 --vocab encoder.json --merges vocab.bpe]
//   cohort-data synthetic --seed 1 --tokens 10000000 --vocab_size 256
//       --alphabet 16 --branching 4 --output_dir data/synth
//
// Exit status: 0 success, 2 bad command line, 1 the run failed.

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "tools/data/data_tool.h"

ABSL_FLAG(std::string, output_dir, "", "directory for train_NNNNNN.bin and val_NNNNNN.bin");
ABSL_FLAG(double, val_fraction, 0.1,
          "fraction in [0, 1) of the tokens that go to val_*.bin (the tail of the stream); "
          "0 writes no val set");
ABSL_FLAG(int64_t, shard_tokens, 100'000'000, "tokens per shard file, at most 2^31-1");
ABSL_FLAG(bool, overwrite, false,
          "replace existing train_/val_ shards in --output_dir instead of refusing");
ABSL_FLAG(std::string, input, "", "text: input files, comma-separated, read in order");
ABSL_FLAG(std::string, tokenizer, "byte",
          "text: 'byte' (one token per byte, vocab 256) or 'gpt2' (GPT-2's byte-level BPE "
          "from --vocab and --merges; ids < 65536). gpt2 reads the inputs twice, streaming: a "
          "first pass counts the tokens, so the val tail is exactly --val_fraction of them, the "
          "second writes them. Text is encoded in chunks cut where no pre-token can span, so "
          "the ids equal encoding it whole");
ABSL_FLAG(std::string, vocab, "",
          "text with --tokenizer gpt2: GPT-2's encoder.json (token -> id), at most 64 MiB");
ABSL_FLAG(std::string, merges, "",
          "text with --tokenizer gpt2: GPT-2's vocab.bpe (merges in rank order), at most 64 MiB");
ABSL_FLAG(uint64_t, seed, 1, "synthetic: seed of the chain and its token streams");
ABSL_FLAG(int64_t, tokens, 10'000'000, "synthetic: tokens to write, train plus val");
ABSL_FLAG(int, vocab_size, 256, "synthetic: token ids are < vocab_size (<= 65536)");
ABSL_FLAG(int, alphabet, 16, "synthetic: distinct symbols the chain uses, <= vocab_size");
ABSL_FLAG(int, order, 2,
          "synthetic: context length of the Markov chain, 1 (last token) or 2 (last two)");
ABSL_FLAG(int, branching, 4,
          "synthetic: successors per two-token context, 1..alphabet; the entropy floor is "
          "ln(branching) nats/token");

int main(int argc, char** argv) {
  // absl's --help lists only flags of files named after the program
  // (cohort-data.cc); ours live in main.cc.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "tools/data/main.cc");
  };
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "Writes llm.c token shards (256 x int32 header, uint16 tokens).\n"
      "  cohort-data text --input FILE[,FILE...] --output_dir DIR [--val_fraction 0.1]\n"
      "      [--shard_tokens N]   byte tokenizer (vocab 256)\n"
      "  cohort-data text --tokenizer gpt2 --vocab encoder.json --merges vocab.bpe\n"
      "      --input FILE[,FILE...] --output_dir DIR   GPT-2's BPE; reads the inputs twice\n"
      "      (counting, then writing) so --val_fraction cuts the tokens exactly\n"
      "  cohort-data synthetic --seed S --tokens N --vocab_size V --alphabet A\n"
      "      --branching K --output_dir DIR   order-1 or -2 Markov chain, prints its entropy floor");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  cohort::log::SetProcessTag("data");
  if (positional.size() != 2) {
    std::cerr << "cohort-data: expected exactly one command, 'text' or 'synthetic', got "
              << positional.size() - 1 << " (see --help)\n";
    return 2;
  }
  cohort::datatool::DataToolConfig config;
  config.command = positional[1];
  config.output_dir = absl::GetFlag(FLAGS_output_dir);
  config.val_fraction = absl::GetFlag(FLAGS_val_fraction);
  config.shard_tokens = absl::GetFlag(FLAGS_shard_tokens);
  config.overwrite = absl::GetFlag(FLAGS_overwrite);
  config.inputs = absl::StrSplit(absl::GetFlag(FLAGS_input), ',', absl::SkipEmpty());
  config.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  config.vocab_path = absl::GetFlag(FLAGS_vocab);
  config.merges_path = absl::GetFlag(FLAGS_merges);
  config.seed = absl::GetFlag(FLAGS_seed);
  config.tokens = absl::GetFlag(FLAGS_tokens);
  config.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  config.alphabet = absl::GetFlag(FLAGS_alphabet);
  config.branching = absl::GetFlag(FLAGS_branching);
  config.order = absl::GetFlag(FLAGS_order);

  const absl::Status status = cohort::datatool::RunDataTool(config, std::cout, std::cerr);
  if (!status.ok()) {
    std::cerr << "cohort-data: " << status.message() << "\n";
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
