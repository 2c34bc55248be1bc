// Regressions found by fuzz/checkpoint_manifest_fuzzer.cc (docs/fuzzing.md).
// The fuzzer's input is in fuzz/corpus/checkpoint_manifest_fuzzer/regression-*.

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cohortctl/safetensors.h"

namespace cohort::cohortctl {
namespace {

// A checkpoint's "model" object is bytes a writer sent (UploadEnd.objects);
// `cohortctl checkpoint export` copies it into the safetensors metadata. Bytes
// that are not UTF-8 went into the header as they were, so the header was
// not JSON and readers refused the file. They become U+FFFD now; UTF-8 text
// passes through.
TEST(SafetensorsFuzzRegressionTest, JsonStringReplacesBytesThatAreNotUtf8) {
  EXPECT_EQ(JsonString("\x99\x8f\x8b\xd2"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonString("gpt \xe2\x82\xac"), "\"gpt \xe2\x82\xac\"");   // a whole euro sign
  EXPECT_EQ(JsonString("gpt \xe2\x82"), "\"gpt \\ufffd\\ufffd\"");     // a cut one
  EXPECT_EQ(JsonString("\xc0\xaf"), "\"\\ufffd\\ufffd\"");             // overlong '/'
  EXPECT_EQ(JsonString("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate
  EXPECT_EQ(JsonString("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // > U+10FFFF
  EXPECT_EQ(JsonString("\xf0\x9f\x98\x80"), "\"\xf0\x9f\x98\x80\"");              // U+1F600
}

TEST(SafetensorsFuzzRegressionTest, MetadataThatIsNotUtf8GivesAUtf8Header) {
  const SafetensorsLayout layout =
      PlanSafetensors({{"wte", {2, 3}}}, {{"model", std::string("\x99\x8f\x8b\xd2\xff\xfe", 6)}});
  const std::string header = layout.prefix.substr(8);
  EXPECT_THAT(header, ::testing::StartsWith(
                          R"({"__metadata__":{"model":"\ufffd\ufffd\ufffd\ufffd\ufffd\ufffd"},)"));
}

}  // namespace
}  // namespace cohort::cohortctl
