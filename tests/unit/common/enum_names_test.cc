#include "common/enum_names.h"

#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/workers.pb.h"
#include "gtest/gtest.h"

namespace cohort {
namespace {

TEST(EnumNamesTest, TheTypePrefixComesOffEveryEnum) {
  EXPECT_EQ(ShortEnumName(v1::JOB_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(ShortEnumName(v1::JOB_STATE_UNSPECIFIED), "UNSPECIFIED");
  EXPECT_EQ(ShortEnumName(v1::WORKER_STATE_IDLE), "IDLE");
  EXPECT_EQ(ShortEnumName(v1::JOB_EVENT_KIND_PROGRESS), "PROGRESS");
  EXPECT_EQ(ShortEnumName(v1::RECOVERY_KIND_PEER), "PEER");
  EXPECT_EQ(ShortEnumName(v1::RECONFIGURE_ROLE_DONOR), "DONOR");
}

TEST(EnumNamesTest, AnUndefinedNumberIsUnknown) {
  EXPECT_EQ(ShortEnumName(static_cast<v1::JobState>(42)), "UNKNOWN(42)");
  EXPECT_EQ(ShortEnumName(static_cast<v1::JobState>(-3)), "UNKNOWN(-3)");
}

}  // namespace
}  // namespace cohort
