// JobManager: submitting, scheduling, cancelling, scaling, deleting, persistence
// and coordinator restarts (the fixture is job_manager_fixture.h).

#include "coordinator/jobs/job_manager.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/job_manager_fixture.h"

namespace cohort::coordinator::job_manager_test {
namespace {

using ::testing::HasSubstr;

TEST_F(JobManagerTest, InvalidSpecIsRefusedWithFieldMessage) {
  v1::JobSpec spec = Spec(/*tensor=*/3, 3, 3);
  Effects effects;
  absl::StatusOr<v1::Job> job = jobs_->Submit(spec, false, now_, &effects);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("parallelism.tensor"));
  EXPECT_TRUE(jobs_->List(true).empty());
}

TEST_F(JobManagerTest, ValidateOnlyCreatesNothing) {
  Effects effects;
  absl::StatusOr<v1::Job> job = jobs_->Submit(Spec(2, 2, 2), true, now_, &effects);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->job_id().empty());
  EXPECT_TRUE(jobs_->List(true).empty());
  EXPECT_TRUE(store_.LoadAll()->empty());
}

TEST_F(JobManagerTest, PendingUntilMinWorkersThenRunningWithMegatronRanks) {
  v1::Job job = Submit(Spec(2, 4, 4));
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.job_id(), "train-1");
  Join("a0", "host-a", 0);
  Join("b0", "host-b", 0);
  Join("a1", "host-a", 1);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(job).message(), HasSubstr("waiting for workers"));
  Effects effects = Join("b1", "host-b", 1);

  job = Get(job);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 1u);
  EXPECT_EQ(job.mesh().data_parallel(), 2);
  EXPECT_EQ(job.mesh().tensor_parallel(), 2);
  ASSERT_EQ(job.mesh().members_size(), 4);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kAssign), 4);
  for (int rank = 0; rank < 4; ++rank) {
    const auto& member = job.mesh().members(rank);
    EXPECT_EQ(member.coordinates().rank(), rank);
    EXPECT_EQ(member.coordinates().tensor(), rank % 2);
    EXPECT_EQ(member.coordinates().data(), rank / 2);
  }
  // Each tensor group lives on one host.
  EXPECT_EQ(job.mesh().members(0).host(), job.mesh().members(1).host());
  EXPECT_EQ(job.mesh().members(2).host(), job.mesh().members(3).host());
  // The Assign carries the worker's own coordinates and the spec.
  for (const auto& member : job.mesh().members()) {
    auto assigns = MessagesTo(effects, member.worker_id(), v1::CoordinatorMessage::kAssign);
    ASSERT_EQ(assigns.size(), 1u);
    EXPECT_EQ(assigns[0].assign().coordinates().rank(), member.coordinates().rank());
    EXPECT_EQ(assigns[0].assign().generation(), 1u);
    EXPECT_EQ(assigns[0].assign().spec().name(), "train");
  }
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(Get(job).ready_workers(), 4);
  EXPECT_EQ(Get(job).message(), "");
}

// Issue 23: GPU jobs go to GPU workers only, and a GPU job that finds none
// says so.
TEST_F(JobManagerTest, AGpuJobWaitsForGpuWorkersAndSaysWhenNoneIsAttached) {
  v1::JobSpec spec = Spec(1, 2, 2);
  spec.set_device_kind(v1::DEVICE_KIND_GPU);
  const v1::Job job = Submit(spec);
  Join("cpu0", "h", 0);
  Join("cpu1", "h", 1);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(job).message(), HasSubstr("waiting for workers: "));
  EXPECT_THAT(Get(job).message(), HasSubstr("(no GPU worker is attached)"));
  v1::Hello gpu = Hello("gpu0", "g", 0, next_incarnation_++);
  gpu.set_device_kind(v1::DEVICE_KIND_GPU);
  JoinHello(gpu);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(job).message(), ::testing::Not(HasSubstr("no GPU worker")));
  gpu = Hello("gpu1", "g", 1, next_incarnation_++);
  gpu.set_device_kind(v1::DEVICE_KIND_GPU);
  JoinHello(gpu);
  const v1::Job running = Get(job);
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  for (const v1::MeshMember& m : running.mesh().members()) {
    EXPECT_THAT(m.worker_id(), ::testing::StartsWith("gpu"));
  }
}

TEST_F(JobManagerTest, LostWorkerBumpsGenerationAndReconfiguresSurvivors) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 2, 4));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  ASSERT_EQ(job.mesh().members_size(), 4);
  const std::string victim = job.mesh().members(3).worker_id();

  // Phase 1: the survivors are asked to suspend; no new generation yet.
  Effects suspend = Lose(victim);
  EXPECT_EQ(CountKind(suspend, v1::CoordinatorMessage::kSuspend), 3);
  EXPECT_EQ(CountKind(suspend, v1::CoordinatorMessage::kReconfigure), 0);
  EXPECT_EQ(Get(job).generation(), 1u);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_THAT(Get(job).message(), HasSubstr(victim));

  // Phase 2 once every survivor answered with the state it holds.
  Effects effects = SuspendAll(job, /*step=*/12);
  v1::Job after = Get(job);
  EXPECT_EQ(after.generation(), 2u);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RECONFIGURING);
  // 3 survivors with tp 2 and 8 micro-batches: dp 1, so 2 workers remain.
  ASSERT_EQ(after.mesh().members_size(), 2);
  // Without ZeRO-1 every replica holds everything: resume from peers at 12.
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_PEER);
  EXPECT_EQ(after.recovery().step(), 12);
  EXPECT_EQ(after.recovery().donors_size(), 0);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kReconfigure), 2);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kStop), 1);
  for (const auto& member : after.mesh().members()) {
    EXPECT_NE(member.worker_id(), victim);
    auto reconf = MessagesTo(effects, member.worker_id(), v1::CoordinatorMessage::kReconfigure);
    ASSERT_EQ(reconf.size(), 1u);
    EXPECT_EQ(reconf[0].reconfigure().generation(), 2u);
  }
  ASSERT_EQ(effects.generation_changes.size(), 1u);
  EXPECT_EQ(effects.generation_changes[0].generation, Generation(2));

  // A status from generation 1 is now stale.
  v1::Job stale = job;
  absl::Status status = Report(after.mesh().members(0).worker_id(), stale,
                               v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  ReportAll(after, v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerTest, SurvivorsKeepTheirCoordinatesWhenASpareFillsTheHole) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 4, 4));
  job = Get(job);
  Join("spare", "h", 9);  // idle: the job is at max
  EXPECT_EQ(Get(job).generation(), 1u);
  const auto before = job.mesh();
  const std::string victim = before.members(1).worker_id();
  Lose(victim);
  Effects effects = SuspendAll(job, /*step=*/0);
  v1::Job after = Get(job);
  EXPECT_EQ(after.generation(), 2u);
  ASSERT_EQ(after.mesh().members_size(), 4);
  for (const auto& old_member : before.members()) {
    if (old_member.worker_id() == victim) continue;
    for (const auto& m : after.mesh().members()) {
      if (m.worker_id() == old_member.worker_id()) {
        EXPECT_EQ(m.coordinates().rank(), old_member.coordinates().rank());
      }
    }
  }
  EXPECT_EQ(after.mesh().members(1).worker_id(), "spare");
  EXPECT_EQ(MessagesTo(effects, "spare", v1::CoordinatorMessage::kAssign).size(), 1u);
}

TEST_F(JobManagerTest, TooFewSurvivorsWaitThenResumeWhenAWorkerJoins) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 4, 4));
  Lose("w0");
  SuspendAll(job, 0);
  v1::Job waiting = Get(job);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_THAT(waiting.message(), HasSubstr("waiting for workers"));
  EXPECT_EQ(waiting.generation(), 1u);  // no runnable mesh, no new generation
  EXPECT_EQ(membership_->CountInState(WorkerState::kAssigned), 3);  // survivors stay reserved

  Effects effects = Join("w9", "h", 9);
  v1::Job resumed = Get(job);
  EXPECT_EQ(resumed.generation(), 2u);
  EXPECT_EQ(resumed.mesh().members_size(), 4);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kReconfigure), 3);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kAssign), 1);
}

TEST_F(JobManagerTest, JoiningWorkersGrowTheMeshTowardMax) {
  Join("w0", "h", 0);
  Join("w1", "h", 1);
  v1::Job job = Submit(Spec(2, 2, 4));
  EXPECT_EQ(Get(job).mesh().members_size(), 2);
  Effects none = Join("w2", "h", 2);  // 3 workers cannot form dp 1.5: no change
  EXPECT_EQ(CountKind(none, v1::CoordinatorMessage::kSuspend), 0);
  EXPECT_EQ(Get(job).generation(), 1u);
  Effects suspend = Join("w3", "h", 3);
  EXPECT_EQ(CountKind(suspend, v1::CoordinatorMessage::kSuspend), 2);
  Effects effects = SuspendAll(job, 0);
  v1::Job grown = Get(job);
  EXPECT_EQ(grown.generation(), 2u);
  EXPECT_EQ(grown.mesh().members_size(), 4);
  EXPECT_EQ(grown.mesh().data_parallel(), 2);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kReconfigure), 2);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kAssign), 2);
  Effects at_max = Join("w4", "h", 4);
  EXPECT_EQ(CountKind(at_max, v1::CoordinatorMessage::kSuspend), 0);
  EXPECT_EQ(Get(job).generation(), 2u);
}

TEST_F(JobManagerTest, AWorkerBelongsToAtMostOneJobAndLaterJobsBackfill) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job big = Submit(Spec(2, 2, 2));
  v1::Job huge = Submit(Spec(2, 4, 4));  // cannot start: 1 idle worker
  v1::JobSpec small_spec = Spec(1, 1, 1);
  v1::Job small = Submit(small_spec);    // backfills the last idle worker
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(huge).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(small).state(), v1::JOB_STATE_RUNNING);
  std::set<std::string> used;
  for (const v1::Job& j : {Get(big), Get(small)}) {
    for (const auto& m : j.mesh().members()) EXPECT_TRUE(used.insert(m.worker_id()).second);
  }
  // Cancelling `big` frees its workers, but `huge` still needs 4.
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(big.job_id()), now_, &effects).ok());
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kStop), 2);
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Get(huge).state(), v1::JOB_STATE_PENDING);
  Join("w3", "h", 3);
  Effects done;
  ASSERT_TRUE(Report(Get(small).mesh().members(0).worker_id(), Get(small),
                     v1::ASSIGNMENT_STATE_COMPLETED, &done, /*step=*/small_spec.steps())
                  .ok());
  EXPECT_EQ(Get(small).state(), v1::JOB_STATE_COMPLETED);
  // The completion carries the final step, which heartbeats may have missed.
  EXPECT_EQ(Get(small).progress().step(), small_spec.steps());
  EXPECT_EQ(Get(huge).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(huge).mesh().members_size(), 4);
}

TEST_F(JobManagerTest, CancelAndErrorsForUnknownOrFinishedJobs) {
  v1::Job job = Submit(Spec(1, 1, 1));
  Effects effects;
  EXPECT_EQ(jobs_->Cancel(JobId("nope-1"), now_, &effects).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_->Get(JobId("nope-1")).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(jobs_->Cancel(JobId(job.job_id()), now_, &effects).ok());
  EXPECT_EQ(jobs_->Cancel(JobId(job.job_id()), now_, &effects).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(jobs_->List(false).empty());
  EXPECT_EQ(jobs_->List(true).size(), 1u);
}

// Issue 21: jobs were never deleted, so their records (and Jobs.List) only
// grew. A finished job can be deleted, and is after the retention.
TEST_F(JobManagerTest, FinishedJobsAreDeletedOnRequestAndAfterTheRetention) {
  v1::Job running = Submit(Spec(1, 1, 1));
  v1::Job first = Submit(Spec(1, 1, 1));
  v1::Job second = Submit(Spec(1, 1, 1));
  EXPECT_EQ(jobs_->Delete(JobId(running.job_id())).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(jobs_->Delete(JobId("nope-1")).code(), absl::StatusCode::kNotFound);
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(first.job_id()), now_, &effects).ok());
  ASSERT_TRUE(jobs_->Delete(JobId(first.job_id())).ok());
  EXPECT_EQ(jobs_->Get(JobId(first.job_id())).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.LoadAll()->size(), 2u);

  // The default retention is 7 days after the job finished.
  ASSERT_TRUE(jobs_->Cancel(JobId(second.job_id()), now_, &effects).ok());
  now_ += absl::Hours(24 * 7) - absl::Seconds(1);
  jobs_->Tick(now_, &effects);
  EXPECT_TRUE(jobs_->Get(JobId(second.job_id())).ok());
  now_ += absl::Seconds(1);
  jobs_->Tick(now_, &effects);
  EXPECT_EQ(jobs_->Get(JobId(second.job_id())).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs_->Get(JobId(running.job_id())).ok());
  ASSERT_EQ(store_.LoadAll()->size(), 1u);
  EXPECT_EQ((*store_.LoadAll())[0].job_id(), running.job_id());
}

TEST_F(JobManagerTest, AFailedMemberFailsTheJobAndFreesTheOthers) {
  Join("w0", "h", 0);
  Join("w1", "h", 1);
  v1::Job job = Submit(Spec(2, 2, 2));
  job = Get(job);
  Effects effects;
  v1::AssignmentStatus status;
  status.set_job_id(job.job_id());
  status.set_generation(job.generation());
  status.set_state(v1::ASSIGNMENT_STATE_FAILED);
  status.set_message("out of memory");
  ASSERT_TRUE(jobs_->OnAssignmentStatus(WorkerId("w0"), status, now_, &effects).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(job).message(), HasSubstr("out of memory"));
  EXPECT_EQ(membership_->CountInState(WorkerState::kIdle), 2);
  EXPECT_EQ(effects.finished_jobs.size(), 1u);
}

TEST_F(JobManagerTest, ScaleValidatesAndShrinks) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 2, 4));
  EXPECT_EQ(Get(job).mesh().members_size(), 4);
  Effects effects;
  absl::StatusOr<v1::Job> bad = jobs_->Scale(JobId(job.job_id()), 4, 2, now_, &effects);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::Job> scaled = jobs_->Scale(JobId(job.job_id()), 2, 2, now_, &effects);
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_EQ(scaled->generation(), 1u);  // suspending first
  SuspendAll(job, 0);
  EXPECT_EQ(Get(job).mesh().members_size(), 2);
  EXPECT_EQ(Get(job).generation(), 2u);
  EXPECT_EQ(membership_->CountInState(WorkerState::kIdle), 2);
}

TEST_F(JobManagerTest, FailedPersistenceCreatesNothing) {
  store_.FailNextPut(absl::UnavailableError("disk full"));
  Effects effects;
  absl::StatusOr<v1::Job> job = jobs_->Submit(Spec(1, 1, 1), false, now_, &effects);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(jobs_->List(true).empty());
}

// A state change whose write failed stays in memory and is written by the
// next Tick (which looks only at jobs whose record is behind).
TEST_F(JobManagerTest, AFailedStateWriteIsRetriedByTheNextTick) {
  const v1::Job job = Submit(Spec(1, 1, 1));
  for (int i = 0; i < 3; ++i) Submit(Spec(1, 1, 1));
  auto stored_state = [&] {
    absl::StatusOr<std::vector<v1::Job>> all = store_.LoadAll();
    EXPECT_TRUE(all.ok()) << all.status();
    for (const v1::Job& stored : *all) {
      if (stored.job_id() == job.job_id()) return stored.state();
    }
    return v1::JOB_STATE_UNSPECIFIED;
  };
  store_.FailNextPut(absl::UnavailableError("disk full"));
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(job.job_id()), now_, &effects).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(stored_state(), v1::JOB_STATE_PENDING);
  jobs_->Tick(now_, &effects);
  EXPECT_EQ(stored_state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, RestartReadoptsReturningWorkersWithoutReplan) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 4, 4));
  job = Get(job);
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);

  // The coordinator restarts: fresh membership and manager over the same store.
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  EXPECT_EQ(jobs_->awaiting_readoption(), 4u);
  v1::Job restored = Get(job);
  EXPECT_EQ(restored.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(restored.generation(), 1u);

  // Three come back holding their place; one never does.
  for (int i = 0; i < 3; ++i) {
    const auto& member = job.mesh().members(i);
    Effects effects = JoinHello(HelloHolding(member, job));
    EXPECT_TRUE(effects.messages.empty());
  }
  EXPECT_EQ(Get(job).generation(), 1u);
  EXPECT_EQ(membership_->CountInState(WorkerState::kAssigned), 3);

  now_ += absl::Seconds(11);
  Effects effects;
  jobs_->Tick(now_, &effects);
  EXPECT_EQ(jobs_->awaiting_readoption(), 0u);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_THAT(Get(job).message(), HasSubstr(job.mesh().members(3).worker_id()));
}

TEST_F(JobManagerTest, RestartFillsWhatARecordFromBeforeAFieldLacks) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  const v1::Job job = Get(Submit(Spec(1, 3, 3)));
  ASSERT_EQ(job.mesh().data_parallel(), 3);
  // The record as a coordinator from before elastic.wait_for_workers_seconds
  // and Mesh.micro_batches wrote it.
  v1::Job old = (*store_.LoadAll())[0];
  old.mutable_spec()->mutable_elastic()->clear_wait_for_workers_seconds();
  old.mutable_mesh()->clear_micro_batches();
  ASSERT_TRUE(store_.Put(old).ok());

  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  const v1::Job restored = Get(job);
  EXPECT_EQ(restored.spec().elastic().wait_for_workers_seconds(), kDefaultWaitForWorkersSeconds);
  // The planner's split of the spec's 8 micro-batches over 3 data ranks.
  EXPECT_THAT(restored.mesh().micro_batches(), ::testing::ElementsAre(3, 3, 2));
  EXPECT_THAT(restored.mesh().micro_batches(),
              ::testing::ElementsAreArray(job.mesh().micro_batches()));
}

TEST_F(JobManagerTest, RestartReasksReadoptedWorkersWhoseReadinessWasNotRecorded) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 2, 4));
  Lose(Get(job).mesh().members(3).worker_id());
  SuspendAll(job, 0);
  v1::Job reconfiguring = Get(job);
  ASSERT_EQ(reconfiguring.state(), v1::JOB_STATE_RECONFIGURING);
  ASSERT_EQ(reconfiguring.mesh().members_size(), 2);
  // One READY reaches the old coordinator; the other dies with it.
  ASSERT_TRUE(Report(reconfiguring.mesh().members(0).worker_id(), reconfiguring,
                     v1::ASSIGNMENT_STATE_READY)
                  .ok());

  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  for (const auto& member : reconfiguring.mesh().members()) {
    Effects effects = JoinHello(HelloHolding(member, reconfiguring));
    auto reconf = MessagesTo(effects, member.worker_id(), v1::CoordinatorMessage::kReconfigure);
    ASSERT_EQ(reconf.size(), 1u) << member.worker_id();
    EXPECT_EQ(reconf[0].reconfigure().generation(), reconfiguring.generation());
    EXPECT_EQ(reconf[0].reconfigure().coordinates().rank(), member.coordinates().rank());
  }
  EXPECT_EQ(Get(job).generation(), reconfiguring.generation());
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
}

// Scheduling walks the jobs not finished, in submit order, also after a
// restart: a cancelled job is never planned, pending ones get workers first
// come, first served.
TEST_F(JobManagerTest, PendingJobsAreScheduledInSubmitOrderAndFinishedOnesNeverAlsoAfterARestart) {
  const v1::Job cancelled = Submit(Spec(1, 1, 1));
  const v1::Job first = Submit(Spec(1, 1, 1));
  const v1::Job second = Submit(Spec(1, 1, 1));
  const v1::Job third = Submit(Spec(1, 1, 1));
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(cancelled.job_id()), now_, &effects).ok());
  Join("w0", "h", 0);
  EXPECT_EQ(Get(first).mesh().members_size(), 1);
  EXPECT_EQ(Get(second).mesh().members_size(), 0);

  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  Join("w1", "h", 1);
  EXPECT_EQ(Get(cancelled).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Get(cancelled).mesh().members_size(), 0);
  EXPECT_EQ(Get(second).mesh().members_size(), 1);
  EXPECT_EQ(Get(third).mesh().members_size(), 0);
  Join("w2", "h", 2);
  EXPECT_EQ(Get(third).mesh().members_size(), 1);
}

TEST_F(JobManagerTest, RestartedWorkerProcessIsNotReadopted) {
  for (int i = 0; i < 2; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 2, 2));
  job = Get(job);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  // w0 comes back as a new process (new incarnation, no held assignment).
  Effects effects = Join(job.mesh().members(0).worker_id(), "h", 0, /*incarnation=*/777);
  v1::Job after = Get(job);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_EQ(after.mesh().members_size(), 1);
}

TEST_F(JobManagerTest, WorkerHoldingAnUnknownAssignmentIsToldToStop) {
  v1::Hello hello = Hello("w0", "h", 0, 5);
  hello.mutable_held()->set_job_id("gone-7");
  hello.mutable_held()->set_generation(3);
  Effects effects = JoinHello(hello);
  auto stops = MessagesTo(effects, "w0", v1::CoordinatorMessage::kStop);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].stop().job_id(), "gone-7");
  EXPECT_EQ(stops[0].stop().generation(), 3u);
}

}  // namespace
}  // namespace cohort::coordinator::job_manager_test
