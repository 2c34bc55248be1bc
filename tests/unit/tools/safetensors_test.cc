#include "tools/cohortctl/safetensors.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::cohortctl {
namespace {

TEST(SafetensorsTest, HeaderLengthJsonOffsetsAndAlignment) {
  const SafetensorsLayout layout =
      PlanSafetensors({{"wte", {4, 2}}, {"lnfb", {2}}}, {{"job", "a\"b"}});
  uint64_t n = 0;
  std::memcpy(&n, layout.prefix.data(), 8);  // little-endian host
  ASSERT_EQ(layout.prefix.size(), 8 + n);
  EXPECT_EQ(n % 8, 0u) << "the data must start 8-byte aligned";
  const std::string header = layout.prefix.substr(8);
  EXPECT_THAT(header, ::testing::StartsWith(
                          R"({"__metadata__":{"job":"a\"b"},"wte":{"dtype":"F32","shape":[4,2],)"
                          R"("data_offsets":[0,32]},"lnfb":{"dtype":"F32","shape":[2],)"
                          R"("data_offsets":[32,40]}})"));
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1);  // space padding
  ASSERT_EQ(layout.file_offsets.size(), 2u);
  EXPECT_EQ(layout.file_offsets[0], layout.prefix.size());
  EXPECT_EQ(layout.file_offsets[1], layout.prefix.size() + 32);
  EXPECT_EQ(layout.file_size, layout.prefix.size() + 40);
}

TEST(SafetensorsTest, JsonStringEscapes) {
  EXPECT_EQ(JsonString("plain"), "\"plain\"");
  EXPECT_EQ(JsonString("a\\b\n\x01"), "\"a\\\\b\\n\\u0001\"");
}

}  // namespace
}  // namespace cohort::cohortctl
