#include "worker/model/gpt_config.h"

#include "gtest/gtest.h"

namespace cohort::model {
namespace {

GptConfig Valid() {
  return GptConfig{.layers = 2, .heads = 4, .width = 64, .vocab_size = 100, .context_length = 32};
}

TEST(GptConfigTest, PaddedVocabRoundsUpToMultipleOf128UnlessGiven) {
  GptConfig config = Valid();
  EXPECT_EQ(config.PaddedVocab(), 128);
  config.vocab_size = 50257;
  EXPECT_EQ(config.PaddedVocab(), 50304);  // GPT-2
  config.vocab_size = 256;
  EXPECT_EQ(config.PaddedVocab(), 256);
  config.padded_vocab = 300;
  EXPECT_EQ(config.PaddedVocab(), 300);
}

TEST(GptConfigTest, ValidConfigPasses) { EXPECT_TRUE(Valid().Validate().ok()); }

TEST(GptConfigTest, EachInvalidFieldIsNamed) {
  struct Case {
    void (*mutate)(GptConfig&);
    const char* field;
  };
  const Case cases[] = {
      {[](GptConfig& c) { c.layers = 0; }, "layers"},
      {[](GptConfig& c) { c.heads = -1; }, "heads"},
      {[](GptConfig& c) { c.width = 0; }, "width"},
      {[](GptConfig& c) { c.vocab_size = 0; }, "vocab_size"},
      {[](GptConfig& c) { c.context_length = 0; }, "context_length"},
      {[](GptConfig& c) { c.heads = 3; }, "heads"},  // does not divide 64
      {[](GptConfig& c) { c.padded_vocab = 99; }, "padded_vocab"},
      {[](GptConfig& c) { c.width = 1 << 15; }, "width"},
  };
  for (const Case& c : cases) {
    GptConfig config = Valid();
    c.mutate(config);
    const absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), absl::string_view::npos) << status;
  }
}

}  // namespace
}  // namespace cohort::model
