// JobManager: progress, the loss history, checkpoint status and the counts by
// state (the fixture is job_manager_fixture.h).

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

TEST_F(JobManagerTest, ProgressFromRankZeroIsPublished) {
  Join("w0", "h", 0);
  v1::Job job = Submit(Spec(1, 1, 1));
  job = Get(job);
  v1::Heartbeat heartbeat;
  heartbeat.set_job_id(job.job_id());
  heartbeat.set_generation(job.generation());
  heartbeat.mutable_progress()->set_step(7);
  heartbeat.mutable_progress()->set_loss(2.5);
  Effects effects;
  // Not before the member is READY: it has not restored a step yet.
  jobs_->OnProgress(WorkerId("w0"), heartbeat, now_, &effects);
  EXPECT_EQ(Get(job).progress().step(), 0);
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);
  effects = Effects();
  jobs_->OnProgress(WorkerId("w0"), heartbeat, now_, &effects);
  EXPECT_EQ(Get(job).progress().step(), 7);
  ASSERT_EQ(effects.events.size(), 1u);
  EXPECT_EQ(effects.events[0].kind, v1::JOB_EVENT_KIND_PROGRESS);
  heartbeat.set_generation(job.generation() + 5);
  heartbeat.mutable_progress()->set_step(8);
  jobs_->OnProgress(WorkerId("w0"), heartbeat, now_, &effects);
  EXPECT_EQ(Get(job).progress().step(), 7);
}

TEST_F(JobManagerTest, RankZerosLossesAndValidationsFormAHistoryThatSurvivesARestart) {
  const v1::Job job = TwoRanksReady();
  const std::string rank0 = job.mesh().members(0).worker_id();
  const std::string rank1 = job.mesh().members(1).worker_id();
  auto beat = [&](const std::string& worker, int64_t step, std::vector<int64_t> validated) {
    v1::Heartbeat heartbeat;
    heartbeat.set_job_id(job.job_id());
    heartbeat.set_generation(job.generation());
    heartbeat.mutable_progress()->set_step(step);
    heartbeat.mutable_progress()->set_loss(10.0 - step);
    for (int64_t s : validated) {
      v1::LossPoint* p = heartbeat.mutable_progress()->add_validation();
      p->set_step(s);
      p->set_loss(20.0 - s);
    }
    Effects effects;
    jobs_->OnProgress(WorkerId(worker), heartbeat, now_, &effects);
    return effects;
  };
  beat(rank0, 1, {});
  beat(rank1, 2, {2});  // not rank 0: ignored
  beat(rank0, 2, {2});
  beat(rank0, 2, {2});  // a repeat adds nothing
  beat(rank0, 4, {2, 4});
  // The last step's validation comes with a heartbeat of the same step.
  Effects last = beat(rank0, 4, {2, 4, 5});
  ASSERT_EQ(last.events.size(), 1u);
  EXPECT_EQ(last.events[0].kind, v1::JOB_EVENT_KIND_PROGRESS);

  auto check = [&](const v1::LossHistory& history) {
    ASSERT_EQ(history.training_size(), 3);
    EXPECT_EQ(history.training(2).step(), 4);
    EXPECT_EQ(history.training(2).loss(), 6.0);
    ASSERT_EQ(history.validation_size(), 3);
    EXPECT_EQ(history.validation(0).step(), 2);
    EXPECT_EQ(history.validation(2).step(), 5);
    EXPECT_EQ(history.validation(2).loss(), 15.0);
  };
  absl::StatusOr<v1::LossHistory> history = jobs_->LossHistory(JobId(job.job_id()));
  ASSERT_TRUE(history.ok()) << history.status();
  check(*history);
  // The job's progress shows the newest validations, and no history.
  EXPECT_EQ(Get(job).progress().validation_size(), 3);
  EXPECT_FALSE(Get(job).has_loss_history());
  EXPECT_EQ(jobs_->LatestValidationLosses().at(job.job_id()), 15.0);
  EXPECT_TRUE(absl::IsNotFound(jobs_->LossHistory(JobId("nope")).status()));

  // Points alone are written by Tick, at most every kHistoryPersistInterval.
  now_ += kHistoryPersistInterval;
  Effects tick;
  jobs_->Tick(now_, &tick);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  history = jobs_->LossHistory(JobId(job.job_id()));
  ASSERT_TRUE(history.ok()) << history.status();
  check(*history);
  EXPECT_FALSE(Get(job).has_loss_history()) << "restored into the history, not the job";
  // The validation loss gauge's source survives the restart and goes with
  // the job's record.
  EXPECT_EQ(jobs_->LatestValidationLosses().at(job.job_id()), 15.0);
  Effects cancel;
  ASSERT_TRUE(jobs_->Cancel(JobId(job.job_id()), now_, &cancel).ok());
  EXPECT_EQ(jobs_->LatestValidationLosses().count(job.job_id()), 1u) << "a finished job's stays";
  ASSERT_TRUE(jobs_->Delete(JobId(job.job_id())).ok());
  EXPECT_TRUE(jobs_->LatestValidationLosses().empty());
}

v1::CheckpointFailure CheckpointFailureAt(int64_t step, absl::Time time,
                                          v1::CheckpointFailureKind kind,
                                          const std::string& reason) {
  v1::CheckpointFailure failure;
  failure.set_step(step);
  failure.set_generation(1);
  *failure.mutable_time() = ToProtoTime(time);
  failure.set_kind(kind);
  failure.set_reason(reason);
  return failure;
}

v1::CheckpointCommit CheckpointCommitAt(int64_t step, absl::Time time) {
  v1::CheckpointCommit commit;
  commit.set_step(step);
  commit.set_generation(1);
  *commit.mutable_time() = ToProtoTime(time);
  return commit;
}

// Issue 43: a full disk failed every checkpoint and only the coordinator's
// log said so. The job's record keeps the newest commit, the newest failure
// and the count, publishes each change, and survives a restart.
TEST_F(JobManagerTest, CheckpointCommitsAndFailuresAreKeptOnTheJobAcrossARestart) {
  const v1::Job job = Submit(Spec(1, 1, 1));
  const JobId id(job.job_id());
  EXPECT_FALSE(Get(job).has_checkpoint_status());
  Effects committed;
  jobs_->OnCheckpointCommitted(id, CheckpointCommitAt(100, now_), &committed);
  ASSERT_EQ(committed.events.size(), 1u);
  EXPECT_EQ(committed.events[0].kind, v1::JOB_EVENT_KIND_CHECKPOINT);
  EXPECT_EQ(committed.events[0].job.checkpoint_status().last_commit().step(), 100);

  const std::string no_space =
      "RocksDB write of a chunk of param/w for job train-1 step 200 generation 1 in data dir "
      "/data/checkpoints failed: IO error: No space left on device";
  now_ += absl::Minutes(1);
  Effects failed;
  jobs_->OnCheckpointFailed(
      id, CheckpointFailureAt(200, now_, v1::CHECKPOINT_FAILURE_KIND_STORAGE, no_space), &failed);
  ASSERT_EQ(failed.events.size(), 1u);
  EXPECT_EQ(failed.events[0].kind, v1::JOB_EVENT_KIND_CHECKPOINT);
  EXPECT_EQ(failed.events[0].job.checkpoint_status().failed_attempts(), 1);
  // A report from another thread that arrives late counts, but does not
  // replace the newer failure; an older step's commit changes nothing.
  Effects late;
  jobs_->OnCheckpointFailed(id,
                            CheckpointFailureAt(150, now_ - absl::Seconds(30),
                                                v1::CHECKPOINT_FAILURE_KIND_ABANDONED, "idle"),
                            &late);
  jobs_->OnCheckpointCommitted(id, CheckpointCommitAt(90, now_), &late);
  // An unknown (deleted) job's reports are dropped.
  jobs_->OnCheckpointFailed(JobId("gone-9"),
                            CheckpointFailureAt(1, now_, v1::CHECKPOINT_FAILURE_KIND_STORAGE, "x"),
                            &late);
  EXPECT_EQ(late.events.size(), 1u) << "only the late failure changed the job";

  auto check = [&](const v1::CheckpointStatus& status) {
    EXPECT_EQ(status.last_commit().step(), 100);
    EXPECT_EQ(FromProtoTime(status.last_commit().time()), now_ - absl::Minutes(1));
    EXPECT_EQ(status.last_failure().step(), 200);
    EXPECT_EQ(status.last_failure().generation(), 1u);
    EXPECT_EQ(status.last_failure().kind(), v1::CHECKPOINT_FAILURE_KIND_STORAGE);
    EXPECT_EQ(status.last_failure().reason(), no_space);
    EXPECT_EQ(FromProtoTime(status.last_failure().time()), now_);
    EXPECT_EQ(status.failed_attempts(), 2);
  };
  check(Get(job).checkpoint_status());
  // A later commit keeps the failure: the reader sees both, and their times.
  now_ += absl::Seconds(5);
  jobs_->OnCheckpointCommitted(id, CheckpointCommitAt(300, now_), &late);
  EXPECT_EQ(Get(job).checkpoint_status().last_commit().step(), 300);
  EXPECT_EQ(Get(job).checkpoint_status().last_failure().step(), 200);

  // The next tick writes the record (not the report itself: a commit's
  // reply does not wait for it), and after a restart the status comes back
  // with the job.
  const v1::CheckpointStatus before = Get(job).checkpoint_status();
  absl::StatusOr<std::vector<v1::Job>> stored = store_.LoadAll();
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_NE((*stored)[0].checkpoint_status().SerializeAsString(), before.SerializeAsString())
      << "written before the tick";
  Effects ticked;
  jobs_->Tick(now_, &ticked);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  EXPECT_EQ(Get(job).checkpoint_status().SerializeAsString(), before.SerializeAsString());
  EXPECT_EQ(Get(job).checkpoint_status().failed_attempts(), 2);
}

// A store's message is kept to kCheckpointReasonBytes and made printable:
// it is in every Job reply and on the user's terminal.
TEST_F(JobManagerTest, ACheckpointFailuresReasonIsBoundedAndPrintable) {
  const v1::Job job = Submit(Spec(1, 1, 1));
  const std::string reason = "IO error:\n\x1b[2J" + std::string(2000, 'x');
  Effects effects;
  jobs_->OnCheckpointFailed(
      JobId(job.job_id()),
      CheckpointFailureAt(10, now_, v1::CHECKPOINT_FAILURE_KIND_STORAGE, reason), &effects);
  const std::string kept = Get(job).checkpoint_status().last_failure().reason();
  EXPECT_THAT(kept, ::testing::StartsWith("IO error:\\n\\x1b[2Jxxx"));
  EXPECT_THAT(kept, ::testing::EndsWith(absl::StrCat("...(", reason.size(), " bytes)")));
  EXPECT_LE(kept.size(), kCheckpointReasonBytes + 32);
  for (char c : kept) EXPECT_TRUE(absl::ascii_isprint(c)) << static_cast<int>(c);
}

// CountByState is kept as jobs come, change state and go (the gauges read it
// on every tick); it must equal a count over every job at each point.
TEST_F(JobManagerTest, CountsByStateFollowSubmitsStateChangesDeletesAndRestarts) {
  std::vector<std::string> ids;
  auto expect_counts = [&](const std::string& when) {
    std::map<v1::JobState, int> counted;
    for (const std::string& id : ids) {
      absl::StatusOr<v1::Job> job = jobs_->Get(JobId(id));
      if (job.ok()) ++counted[job->state()];
    }
    EXPECT_EQ(jobs_->CountByState(), counted) << when;
  };
  for (int i = 0; i < 5; ++i) ids.push_back(Submit(Spec(1, 1, 1)).job_id());
  expect_counts("after five submits");
  Join("w0", "h", 0);
  Join("w1", "h", 1);
  expect_counts("after two were scheduled");
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(ids[0]), now_, &effects).ok());
  ASSERT_TRUE(jobs_->Cancel(JobId(ids[4]), now_, &effects).ok());
  expect_counts("after two cancels");
  ASSERT_TRUE(jobs_->Delete(JobId(ids[4])).ok());
  ASSERT_FALSE(jobs_->Delete(JobId(ids[1])).ok()) << "only a finished job can be deleted";
  expect_counts("after a delete and a refused one");
  EXPECT_EQ(jobs_->List(/*include_finished=*/true).size(), 4u);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  expect_counts("after a restart");
  ASSERT_TRUE(jobs_->Delete(JobId(ids[0])).ok());
  expect_counts("after deleting a restored job");
  ids.push_back(Submit(Spec(1, 1, 1)).job_id());
  expect_counts("after a submit following the restart");
  EXPECT_EQ(jobs_->List(/*include_finished=*/true).size(), 4u);
}

TEST_F(JobManagerTest, TheFinalStepJoinsTheHistoryWhicheverMemberCompletesFirst) {
  const v1::Job job = TwoRanksReady();
  const std::string rank0 = job.mesh().members(0).worker_id();
  const std::string rank1 = job.mesh().members(1).worker_id();
  auto complete = [&](const std::string& worker) {
    v1::AssignmentStatus status;
    status.set_job_id(job.job_id());
    status.set_generation(job.generation());
    status.set_state(v1::ASSIGNMENT_STATE_COMPLETED);
    status.mutable_progress()->set_step(job.spec().steps());
    status.mutable_progress()->set_loss(1.25);
    v1::LossPoint* validation = status.mutable_progress()->add_validation();
    validation->set_step(job.spec().steps());
    validation->set_loss(1.5);
    Effects effects;
    return jobs_->OnAssignmentStatus(WorkerId(worker), status, now_, &effects);
  };
  // The last heartbeat came before the last step; rank 1 reports first.
  ASSERT_TRUE(complete(rank1).ok());
  ASSERT_TRUE(complete(rank0).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_COMPLETED);
  absl::StatusOr<v1::LossHistory> history = jobs_->LossHistory(JobId(job.job_id()));
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->training_size(), 1);
  EXPECT_EQ(history->training(0).step(), job.spec().steps());
  EXPECT_EQ(history->training(0).loss(), 1.25);
  ASSERT_EQ(history->validation_size(), 1);
  EXPECT_EQ(history->validation(0).loss(), 1.5);
}

}  // namespace
}  // namespace cohort::coordinator::job_manager_test
