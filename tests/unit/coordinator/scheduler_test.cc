#include "coordinator/jobs/scheduler.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_parts.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::MessagesOfKind;

class SchedulerTest : public ::testing::Test {
 protected:
  SchedulerTest() : parts_(/*warm_spares_per_job=*/0) {}

  int CountKind(const Effects& effects, v1::CoordinatorMessage::KindCase kind) {
    int n = 0;
    for (const auto& m : effects.messages) n += m.message.kind_case() == kind;
    return n;
  }

  // A job of 2 to `max_workers` started on w1 and w2, its generation in
  // effect.
  JobEntry& RunningOnTwo(int max_workers) {
    parts_.Join("w1", "h1", 0);
    parts_.Join("w2", "h1", 1);
    JobEntry& entry = parts_.Add(2, max_workers);
    Effects started;
    parts_.scheduler.Schedule(parts_.now, &started);
    EXPECT_EQ(entry.job.state(), v1::JOB_STATE_RUNNING);
    testing::JobParts::TakeEffect(entry);
    return entry;
  }

  testing::JobParts parts_;
};

TEST_F(SchedulerTest, PendingJobStartsOnIdleWorkersAsItsFirstGeneration) {
  parts_.Join("w1", "h1", 0);
  parts_.Join("w2", "h1", 1);
  JobEntry& entry = parts_.Add(2, 2);
  Effects effects;
  parts_.scheduler.Schedule(parts_.now, &effects);
  EXPECT_EQ(entry.job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(entry.job.generation(), 1u);
  EXPECT_EQ(entry.job.mesh().members_size(), 2);
  EXPECT_EQ(MessagesOfKind(effects, "w1", v1::CoordinatorMessage::kAssign).size(), 1u);
  EXPECT_EQ(MessagesOfKind(effects, "w2", v1::CoordinatorMessage::kAssign).size(), 1u);
  EXPECT_FALSE(parts_.membership.HasIdle(v1::DEVICE_KIND_CPU));
}

TEST_F(SchedulerTest, JobThatCannotStartSaysWhyAndDoesNotBlockSmallerLaterOnes) {
  parts_.Join("w1", "h1", 0);
  parts_.Join("w2", "h1", 1);
  JobEntry& big = parts_.Add(4, 4);
  JobEntry& small = parts_.Add(2, 2);
  Effects effects;
  parts_.scheduler.Schedule(parts_.now, &effects);
  EXPECT_EQ(big.job.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(big.job.message(), HasSubstr("waiting for workers"));
  EXPECT_EQ(small.job.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(SchedulerTest, PendingJobSaysWhenNoWorkerOfItsKindIsAttached) {
  JobEntry& entry = parts_.Add(1, 1);
  Effects effects;
  parts_.scheduler.Schedule(parts_.now, &effects);
  EXPECT_THAT(entry.job.message(), HasSubstr("no CPU worker is attached"));
}

TEST_F(SchedulerTest, JobWithMembersAwaitedForReadoptionIsLeftAlone) {
  parts_.Join("w1", "h1", 0);
  JobEntry& entry = parts_.Add(1, 1);
  parts_.table.awaiting()[WorkerId("w9")] =
      Awaited{JobId(entry.job.job_id()), parts_.now + absl::Seconds(10)};
  Effects effects;
  parts_.scheduler.Schedule(parts_.now, &effects);
  EXPECT_EQ(entry.job.state(), v1::JOB_STATE_PENDING);
  EXPECT_TRUE(effects.messages.empty());
}

TEST_F(SchedulerTest, RunningJobBelowMaxWorkersGrowsOntoNewIdleWorkers) {
  JobEntry& entry = RunningOnTwo(4);
  parts_.Join("w3", "h2", 0);
  parts_.Join("w4", "h2", 1);
  Effects effects;
  parts_.scheduler.Schedule(parts_.now, &effects);
  // Growth is a re-plan: the members suspend first (Replanner).
  EXPECT_EQ(entry.job.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kSuspend), 2);
  ASSERT_TRUE(entry.suspension.has_value());
  EXPECT_TRUE(entry.suspension->growth);
}

TEST_F(SchedulerTest, RunningJobAtMaxWorkersIsNotReplanned) {
  JobEntry& entry = RunningOnTwo(2);
  parts_.Join("w3", "h2", 0);
  Effects effects;
  parts_.scheduler.Schedule(parts_.now, &effects);
  EXPECT_EQ(entry.job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(effects.messages.empty());
}

}  // namespace
}  // namespace cohort::coordinator
