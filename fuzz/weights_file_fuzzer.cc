// Fuzz target: the files a user points a job or a tool at besides token
// shards: a safetensors header (checkpoint.init_from, cohort-sample's
// exports) and GPT-2's encoder.json and vocab.bpe (cohort-data --tokenizer
// gpt2), then text through that tokenizer.
//
// The input is records (fuzz_support.h), by selector % 4:
//   0  a safetensors JSON header, over a data section of the record's first
//      byte x 64 bytes (so offsets both fit and overrun);
//   1  encoder.json contents, kept for the next tokenizer;
//   2  vocab.bpe contents; builds the tokenizer from the last encoder.json;
//   3  text: pre-tokenized, and encoded and decoded by the last tokenizer.
//
// Checks, besides the sanitizers: errors are proper statuses; a header that
// parses lists tensors whose bytes are their shape times their dtype size,
// inside the data section, in order and without overlap; pre-tokens are
// non-empty and concatenate to the text; decoding an encoding gives the
// text back (byte-level BPE is lossless) and every id is in the vocabulary.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/safetensors_reader.h"
#include "fuzz/fuzz_support.h"
#include "worker/data/gpt2_pretokenizer.h"
#include "worker/data/gpt2_tokenizer.h"

namespace cohort::fuzz {
namespace {

void Header(std::string_view payload) {
  const uint64_t data_bytes = payload.empty() ? 0 : static_cast<uint8_t>(payload[0]) * 64ull;
  const std::string_view json = payload.empty() ? payload : payload.substr(1);
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(absl::string_view(json.data(), json.size()), data_bytes, "fuzz");
  if (!header.ok()) {
    CheckHandlerError(header.status(), "ParseSafetensorsHeader");
    return;
  }
  uint64_t end = 0;
  for (const SafetensorsEntry& t : header->tensors) {
    Require(!t.name.empty(), "a tensor without a name");
    const int size = SafetensorsDTypeSize(t.dtype);
    Require(size > 0, "a tensor of an unknown dtype");
    Require(t.bytes == static_cast<uint64_t>(t.NumElements()) * static_cast<uint64_t>(size),
            "a tensor whose bytes are not its shape times its dtype");
    const uint64_t data_start = 8 + payload.size() - 1;  // file offset of the data section
    Require(t.file_offset >= data_start + end, "tensors out of order or overlapping");
    end = t.file_offset - data_start + t.bytes;
    Require(end <= data_bytes, "a tensor past the data section");
  }
}

struct State {
  std::string encoder_json;
  std::optional<data::Gpt2Tokenizer> tokenizer;
};

void Text(std::string_view text, const State& state) {
  std::string joined;
  for (std::string_view piece : data::Gpt2PreTokenize(text)) {
    Require(!piece.empty(), "an empty pre-token");
    joined.append(piece);
  }
  Require(joined == text, "pre-tokens do not concatenate to the text");
  if (!state.tokenizer.has_value()) return;
  absl::StatusOr<std::vector<uint16_t>> ids = state.tokenizer->Encode(text);
  if (!ids.ok()) {
    CheckHandlerError(ids.status(), "Gpt2Tokenizer::Encode");
    return;
  }
  for (const uint16_t id : *ids) {
    Require(id < state.tokenizer->vocab_size(), "an id outside the vocabulary");
  }
  absl::StatusOr<std::string> decoded = state.tokenizer->Decode(std::span<const uint16_t>(*ids));
  Require(decoded.ok(), "an encoding that does not decode");
  Require(*decoded == text, "decoding an encoding does not give the text back");
}

}  // namespace
}  // namespace cohort::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cohort::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort::fuzz;
  State state;
  RecordReader reader(std::string_view(reinterpret_cast<const char*>(data), size));
  Record record;
  while (reader.Next(&record)) {
    switch (record.selector % 4) {
      case 0:
        Header(record.payload);
        break;
      case 1:
        state.encoder_json = std::string(record.payload);
        break;
      case 2: {
        absl::StatusOr<cohort::data::Gpt2Tokenizer> tokenizer =
            cohort::data::Gpt2Tokenizer::FromContents(state.encoder_json, record.payload);
        if (tokenizer.ok()) {
          state.tokenizer.emplace(*std::move(tokenizer));
        } else {
          CheckHandlerError(tokenizer.status(), "Gpt2Tokenizer::FromContents");
        }
        break;
      }
      case 3:
        Text(record.payload, state);
        break;
    }
  }
  return 0;
}
