#include "tools/sample/sample_tokenizer.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/data/byte_tokenizer.h"
#include "worker/data/gpt2_tokenizer.h"

namespace cohort::sample {
namespace {

// absl::string_view is its own type in Debian's Abseil; the data layer
// takes std::string_view.
std::string_view Std(absl::string_view text) { return std::string_view(text.data(), text.size()); }

class ByteSampleTokenizer final : public SampleTokenizer {
 public:
  absl::string_view name() const override { return "byte"; }
  int vocab_size() const override { return data::kByteVocabSize; }

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override {
    const std::vector<uint16_t> ids = data::ByteEncode(Std(text));
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= data::kByteVocabSize) {
        return absl::InvalidArgumentError(absl::StrCat("token ", i, " has id ", ids[i],
                                                       ", outside the byte vocabulary [0, ",
                                                       data::kByteVocabSize, ")"));
      }
      text.push_back(static_cast<char>(static_cast<unsigned char>(ids[i])));
    }
    return text;
  }
};

class Gpt2SampleTokenizer final : public SampleTokenizer {
 public:
  explicit Gpt2SampleTokenizer(data::Gpt2Tokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {}

  absl::string_view name() const override { return "gpt2"; }
  int vocab_size() const override { return tokenizer_.vocab_size(); }

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override {
    std::vector<uint16_t> ids;
    if (absl::Status s = tokenizer_.EncodeAppend(Std(text), &ids); !s.ok()) return s;
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    return tokenizer_.Decode(ids);
  }

 private:
  data::Gpt2Tokenizer tokenizer_;
};

}  // namespace

absl::StatusOr<TokenizerKind> ParseTokenizerKind(absl::string_view text) {
  if (text == "byte") return TokenizerKind::kByte;
  if (text == "gpt2") return TokenizerKind::kGpt2;
  return absl::InvalidArgumentError(
      absl::StrCat("--tokenizer must be byte or gpt2, not \"", text, "\""));
}

absl::StatusOr<std::unique_ptr<SampleTokenizer>> SampleTokenizer::Load(
    const TokenizerOptions& options) {
  switch (options.kind) {
    case TokenizerKind::kByte:
      if (!options.encoder_json.empty() || !options.merges.empty()) {
        return absl::InvalidArgumentError(
            "--vocab and --merges are GPT-2's files; they need --tokenizer gpt2");
      }
      return std::make_unique<ByteSampleTokenizer>();
    case TokenizerKind::kGpt2: {
      if (options.encoder_json.empty() || options.merges.empty()) {
        return absl::InvalidArgumentError(
            "--tokenizer gpt2 needs --vocab (encoder.json) and --merges (vocab.bpe)");
      }
      absl::StatusOr<data::Gpt2Tokenizer> gpt2 =
          data::Gpt2Tokenizer::Load(options.encoder_json, options.merges);
      if (!gpt2.ok()) return gpt2.status();
      return std::make_unique<Gpt2SampleTokenizer>(*std::move(gpt2));
    }
  }
  return absl::InvalidArgumentError("unknown tokenizer kind");
}

}  // namespace cohort::sample
