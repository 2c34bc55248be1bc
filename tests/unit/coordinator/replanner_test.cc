#include "coordinator/jobs/replanner.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_parts.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::MessagesOfKind;

class ReplannerTest : public ::testing::Test {
 protected:
  ReplannerTest() : parts_(/*warm_spares_per_job=*/0) {}

  // A job running generation 1 on w1 and w2, which took effect.
  JobEntry& Running(int min_workers, int max_workers) {
    parts_.Join("w1", "h1", 0);
    parts_.Join("w2", "h1", 1);
    JobEntry& entry = parts_.Add(min_workers, max_workers);
    Effects effects;
    parts_.scheduler.Schedule(parts_.now, &effects);
    EXPECT_EQ(entry.job.generation(), 1u);
    testing::JobParts::TakeEffect(entry);
    return entry;
  }

  // `worker` answers its Suspend, holding the live state at `step`.
  void Suspended(JobEntry& entry, const std::string& worker, int64_t step, Effects* effects) {
    v1::AssignmentStatus status;
    status.set_job_id(entry.job.job_id());
    status.set_generation(entry.job.generation());
    status.set_state(v1::ASSIGNMENT_STATE_SUSPENDED);
    v1::HeldState* held = status.add_held_states();
    held->set_generation(entry.job.live_state().generation());
    held->set_step(step);
    parts_.replanner.OnSuspended(entry, WorkerId(worker), status, parts_.now, effects);
  }

  testing::JobParts parts_;
};

TEST_F(ReplannerTest, ReplanAsksEveryRemainingMemberToSuspend) {
  JobEntry& entry = Running(1, 2);
  Effects effects;
  parts_.replanner.Replan(entry, "worker w3 drained", /*only_if_larger=*/false, parts_.now,
                          &effects);
  EXPECT_EQ(entry.job.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_THAT(entry.job.message(), HasSubstr("suspending 2 members"));
  EXPECT_EQ(MessagesOfKind(effects, "w1", v1::CoordinatorMessage::kSuspend).size(), 1u);
  EXPECT_EQ(MessagesOfKind(effects, "w2", v1::CoordinatorMessage::kSuspend).size(), 1u);
  EXPECT_TRUE(entry.ready.empty());
  EXPECT_EQ(entry.job.generation(), 1u);  // no plan before every answer
}

TEST_F(ReplannerTest, GrowthNotPossibleIsNotStarted) {
  JobEntry& entry = Running(1, 4);
  Effects effects;
  parts_.replanner.Replan(entry, "growing", /*only_if_larger=*/true, parts_.now, &effects);
  EXPECT_FALSE(entry.suspension.has_value());
  EXPECT_EQ(entry.job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(effects.messages.empty());
}

TEST_F(ReplannerTest, LastAnswerPlansTheNextGenerationFromTheSurvivorsMemory) {
  JobEntry& entry = Running(2, 4);
  parts_.Join("w3", "h2", 0);
  parts_.Join("w4", "h2", 1);
  Effects effects;
  parts_.replanner.Replan(entry, "growing", /*only_if_larger=*/true, parts_.now, &effects);
  ASSERT_TRUE(entry.suspension.has_value());
  Suspended(entry, "w1", 7, &effects);
  EXPECT_EQ(entry.job.generation(), 1u);  // w2 has not answered
  Suspended(entry, "w2", 7, &effects);
  EXPECT_FALSE(entry.suspension.has_value());
  EXPECT_EQ(entry.job.generation(), 2u);
  EXPECT_EQ(entry.job.mesh().members_size(), 4);
  EXPECT_EQ(entry.job.recovery().kind(), v1::RECOVERY_KIND_PEER);
  EXPECT_EQ(entry.job.recovery().step(), 7);
  EXPECT_EQ(MessagesOfKind(effects, "w1", v1::CoordinatorMessage::kReconfigure).size(), 1u);
  EXPECT_EQ(MessagesOfKind(effects, "w3", v1::CoordinatorMessage::kAssign).size(), 1u);
  ASSERT_EQ(effects.generation_changes.size(), 1u);
  EXPECT_EQ(effects.generation_changes[0].generation, Generation(2));
}

TEST_F(ReplannerTest, WaitsForWorkersWhenTheSurvivorsCannotFormAMesh) {
  JobEntry& entry = Running(2, 2);
  const WorkerRecord* w2 = parts_.membership.Find(WorkerId("w2"));
  ASSERT_TRUE(
      parts_.membership.MarkLost(WorkerId("w2"), w2->incarnation, LossReason::kHang, parts_.now)
          .has_value());
  Effects effects;
  parts_.replanner.Replan(entry, "worker w2 lost", /*only_if_larger=*/false, parts_.now, &effects);
  EXPECT_TRUE(MessagesOfKind(effects, "w2", v1::CoordinatorMessage::kSuspend).empty());
  Suspended(entry, "w1", 3, &effects);
  ASSERT_TRUE(entry.suspension.has_value());
  EXPECT_TRUE(entry.suspension->waiting_since.has_value());
  EXPECT_THAT(entry.job.message(), HasSubstr("waiting for workers"));
  EXPECT_EQ(entry.job.generation(), 1u);
}

TEST_F(ReplannerTest, RemembersOnlyLostMembersWhoseProcessMayBeAlive) {
  JobEntry& entry = Running(1, 2);
  const Incarnation w1 = parts_.membership.Find(WorkerId("w1"))->incarnation;
  const Incarnation w2 = parts_.membership.Find(WorkerId("w2"))->incarnation;
  const JobId id(entry.job.job_id());
  parts_.replanner.RememberReturning(
      entry, LostWorker{WorkerId("w1"), w1, id, LossReason::kStreamBroken, absl::ZeroDuration()},
      parts_.now);
  parts_.replanner.RememberReturning(
      entry, LostWorker{WorkerId("w2"), w2, id, LossReason::kReplaced, absl::ZeroDuration()},
      parts_.now);
  ASSERT_TRUE(entry.returning.contains("w1"));
  EXPECT_FALSE(entry.returning.contains("w2"));
  // A broken stream is awaited for the stream's grace, not the whole one.
  EXPECT_EQ(entry.returning.at("w1").deadline,
            parts_.now + std::min(Replanner::Options{}.stream_rejoin_grace,
                                  parts_.replanner.RejoinGrace(entry)));
}

}  // namespace
}  // namespace cohort::coordinator
