#include "common/safe_text.h"

#include <string>

#include "gtest/gtest.h"

namespace cohort {
namespace {

TEST(SafeTextTest, QuotedShowsShortPrintableTextOnly) {
  EXPECT_EQ(Quoted("w0"), "\"w0\"");
  EXPECT_EQ(Quoted("w0\nforged"), "<9 bytes, not shown>");
  EXPECT_EQ(Quoted(std::string(65, 'x')), "<65 bytes, not shown>");
  EXPECT_EQ(Quoted(std::string(65, 'x'), 100), "\"" + std::string(65, 'x') + "\"");
}

TEST(SafeTextTest, LogSafeEscapesControlBytesAndCuts) {
  EXPECT_EQ(LogSafe("a\nb\\c\x01\xff"), "a\\nb\\\\c\\x01\\xff");
  EXPECT_EQ(LogSafe(std::string(10, 'x'), 4), "xxxx...(10 bytes)");
}

}  // namespace
}  // namespace cohort
