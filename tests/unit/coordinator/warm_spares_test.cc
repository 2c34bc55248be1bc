#include "coordinator/jobs/warm_spares.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_parts.h"

namespace cohort::coordinator {
namespace {

using testing::MessagesOfKind;

// Starts a job of two workers (w1, w2) with w3 left idle.
JobEntry& StartWithOneIdle(testing::JobParts& parts, Effects* effects) {
  parts.Join("w1", "h1", 0);
  parts.Join("w2", "h1", 1);
  parts.Join("w3", "h2", 0);
  JobEntry& entry = parts.Add(2, 2);
  parts.scheduler.Schedule(parts.now, effects);  // ends with WarmSpares::Update
  EXPECT_EQ(entry.job.state(), v1::JOB_STATE_RUNNING);
  return entry;
}

TEST(WarmSparesTest, IdleWorkerLeftOverPreparesTheLastPlaceOfARunningJob) {
  testing::JobParts parts(/*warm_spares_per_job=*/1);
  Effects effects;
  JobEntry& entry = StartWithOneIdle(parts, &effects);
  const auto warm = MessagesOfKind(effects, "w3", v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].warm_up().job_id(), entry.job.job_id());
  EXPECT_EQ(warm[0].warm_up().generation(), entry.job.generation());
  EXPECT_EQ(warm[0].warm_up().coordinates().rank(), 1);  // the last of two
  EXPECT_GT(warm[0].warm_up().sequence(), 0u);
}

TEST(WarmSparesTest, UnchangedSpareIsNotToldAgain) {
  testing::JobParts parts(/*warm_spares_per_job=*/1);
  Effects started;
  StartWithOneIdle(parts, &started);
  Effects effects;
  parts.warm.Update(&effects);
  EXPECT_TRUE(effects.messages.empty());
}

TEST(WarmSparesTest, SpareIsReleasedWhenItsJobFinishes) {
  testing::JobParts parts(/*warm_spares_per_job=*/1);
  Effects started;
  JobEntry& entry = StartWithOneIdle(parts, &started);
  const uint64_t named =
      MessagesOfKind(started, "w3", v1::CoordinatorMessage::kWarmUp)[0].warm_up().sequence();
  Effects effects;
  parts.table.MarkFinished(entry, parts.now);
  parts.table.SetState(entry, v1::JOB_STATE_CANCELLED, "", parts.now, &effects);
  parts.warm.Update(&effects);
  const auto release = MessagesOfKind(effects, "w3", v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(release.size(), 1u);
  EXPECT_TRUE(release[0].warm_up().job_id().empty());
  EXPECT_GT(release[0].warm_up().sequence(), named);
}

TEST(WarmSparesTest, NoSpareIsNamedWhenPerJobIsZero) {
  testing::JobParts parts(/*warm_spares_per_job=*/0);
  Effects effects;
  StartWithOneIdle(parts, &effects);
  EXPECT_TRUE(MessagesOfKind(effects, "w3", v1::CoordinatorMessage::kWarmUp).empty());
}

TEST(WarmSparesTest, JobMidRecoveryGetsNoNewSpare) {
  testing::JobParts parts(/*warm_spares_per_job=*/1);
  parts.Join("w1", "h1", 0);
  parts.Join("w2", "h1", 1);
  JobEntry& entry = parts.Add(2, 2);
  Effects started;
  parts.scheduler.Schedule(parts.now, &started);
  entry.suspension.emplace();  // a re-plan in progress
  parts.Join("w3", "h2", 0);
  Effects effects;
  parts.warm.Update(&effects);
  EXPECT_TRUE(effects.messages.empty());
}

}  // namespace
}  // namespace cohort::coordinator
