#include "common/log.h"

#include <algorithm>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort {
namespace {

using ::testing::HasSubstr;

// Issue 21: a worker id with a newline forged lines in the coordinator's log.
TEST(LogTest, ARecordIsOneLineWhateverItsMessageHolds) {
  ::testing::internal::CaptureStderr();
  LOG(WARNING) << "worker " << "w0\nI 2026-12-05T00:00:00.000Z forged.cc:1] evil\r" << " attached";
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_THAT(out, HasSubstr("w0\\nI 2026-12-05T00:00:00.000Z forged.cc:1] evil\\x0d attached\n"));
}

}  // namespace
}  // namespace cohort
