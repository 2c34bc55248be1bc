#include "worker/data/byte_tokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ByteTokenizerTest, EachByteIsOneTokenInclusiveOfHighBytes) {
  // "é" in UTF-8 is C3 A9: high bytes must map to 195 and 169, not negatives.
  EXPECT_THAT(ByteEncode("A\xc3\xa9\n"), ElementsAre(65, 195, 169, 10));
}

TEST(ByteTokenizerTest, RoundTripsEveryByteValue) {
  std::string text;
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  }
  const std::vector<uint16_t> tokens = ByteEncode(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (size_t i = 0; i < 256; ++i) ASSERT_EQ(tokens[i], i);
  absl::StatusOr<std::string> decoded = ByteDecode(tokens);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, text);
}

TEST(ByteTokenizerTest, EncodeAppendKeepsExistingTokens) {
  std::vector<uint16_t> tokens = {7};
  ByteEncodeAppend("hi", &tokens);
  EXPECT_THAT(tokens, ElementsAre(7, 'h', 'i'));
}

TEST(ByteTokenizerTest, DecodeRejectsIdsOutsideTheByteVocabulary) {
  const std::vector<uint16_t> tokens = {104, 105, 256};
  absl::StatusOr<std::string> decoded = ByteDecode(tokens);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(), HasSubstr("token 2 has id 256"));
}

}  // namespace
}  // namespace cohort::data
