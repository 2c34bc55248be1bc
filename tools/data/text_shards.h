#pragma once
// Text to token shards: the input files are read in order, as one stream of
// bytes, and the tail val_fraction of its tokens becomes the val set. Two
// tokenizers:
//   - bytes (worker/data/byte_tokenizer.h): one token per byte, so the token
//     total, and with it the train/val cut, is known from the file sizes and
//     the data streams through once;
//   - GPT-2's BPE (worker/data/gpt2_tokenizer.h): the total is known only
//     after encoding, so the inputs are read twice, a first pass counting
//     the tokens and a second writing them; the cut is then exact, as with
//     bytes. Both passes stream: text is read in read_chunk_bytes chunks and
//     encoded up to its last safe cut (Gpt2SafeCut: a place no pre-token
//     spans), the rest carried into the next chunk, so the ids equal those
//     of encoding the whole stream at once. Should the carry reach
//     max_carry_bytes without a safe cut (that much text without a change
//     between letters, digits, spaces and punctuation), it is cut at a
//     character boundary anyway and counted in forced_cuts: GPT-2 could
//     split the text there differently.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/data/split_writer.h"
#include "worker/data/gpt2_tokenizer.h"

namespace cohort::datatool {

struct TextShardsOptions {
  // Members have default initializers so designated initializers may name
  // only some of them under -Wextra.
  std::vector<std::string> inputs{};
  std::string output_dir{};
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  bool replace_existing = false;
  ProgressFn progress{};  // may be empty
  // nullptr: the byte tokenizer; else GPT-2's BPE (not owned; must outlive
  // the call).
  const data::Gpt2Tokenizer* gpt2 = nullptr;
  // gpt2's counting pass: called with the input bytes read so far and their
  // total. May be empty.
  ProgressFn count_progress{};
  // gpt2: bytes read at a time, and the most text held back waiting for a
  // safe cut (>= read_chunk_bytes). Tests make them small.
  size_t read_chunk_bytes = size_t{1} << 20;
  size_t max_carry_bytes = size_t{4} << 20;
};

struct TextShardsSummary {
  SplitSummary split{};
  int64_t input_bytes = 0;
  // gpt2: cuts made without a safe cut, per pass (see above).
  int64_t forced_cuts = 0;
};

// Writes train_*.bin (and val_*.bin when val_fraction > 0) into output_dir.
// Errors: InvalidArgument if inputs is empty or the chunk sizes are out of
// range; NotFound naming a missing input; Internal for unreadable inputs;
// FailedPrecondition if an input changes while being read (or, for gpt2,
// between the passes); those of SplitWriter and Gpt2Tokenizer::EncodeAppend.
absl::StatusOr<TextShardsSummary> WriteTextShards(const TextShardsOptions& options);

}  // namespace cohort::datatool
