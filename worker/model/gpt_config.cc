#include "worker/model/gpt_config.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_spec/sharding.h"

namespace cohort::model {
namespace {

absl::Status RequirePositive(const char* field, int value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("GptConfig.", field, " must be > 0, got ", value));
}

}  // namespace

int GptConfig::PaddedVocab() const {
  if (padded_vocab != 0) return padded_vocab;
  return static_cast<int>(PaddedVocabulary(vocab_size));
}

absl::Status GptConfig::Validate() const {
  for (const auto& [field, value] : {std::pair<const char*, int>{"layers", layers},
                                     {"heads", heads},
                                     {"width", width},
                                     {"vocab_size", vocab_size},
                                     {"context_length", context_length}}) {
    if (absl::Status s = RequirePositive(field, value); !s.ok()) return s;
  }
  if (width % heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptConfig.heads (", heads, ") must divide GptConfig.width (", width, ")"));
  }
  if (padded_vocab != 0 && padded_vocab < vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig.padded_vocab (", padded_vocab,
                                                   ") must be 0 or >= vocab_size (", vocab_size,
                                                   ")"));
  }
  if (static_cast<int64_t>(vocab_size) + kVocabPadMultiple > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptConfig.vocab_size (", vocab_size, ") is too large"));
  }
  // The coordinator refuses these at submit (job_spec_defaults.h).
  if (width > kMaxModelWidth) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig.width (", width,
                                                   ") is over the engine's limit of ",
                                                   kMaxModelWidth));
  }
  return absl::OkStatus();
}

}  // namespace cohort::model
