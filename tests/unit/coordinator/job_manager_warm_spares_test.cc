// JobManager: warm spares as JobManager's events change them (WarmSpares's own
// tests are warm_spares_test.cc; the fixture is job_manager_fixture.h).

#include "coordinator/jobs/job_manager.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/job_manager_fixture.h"

namespace cohort::coordinator::job_manager_test {
namespace {

using ::testing::HasSubstr;

// --- Warm spares (WarmSpares, through JobManager) ---

TEST_F(JobManagerTest, AnIdleWorkerLeftOverPreparesTheLastPlaceAndIsReleasedWhenTheJobEnds) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  Effects submitted;
  v1::Job job = Submit(Spec(1, 2, 2), &submitted);
  job = Get(job);
  ASSERT_EQ(job.mesh().members_size(), 2);
  const std::string spare = "w2";
  ASSERT_TRUE(membership_->Find(WorkerId(spare))->state == WorkerState::kIdle);
  // The spare is told the job, its spec and mesh, and the place to prepare:
  // the mesh's last rank.
  auto warm = MessagesTo(submitted, spare, v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].warm_up().job_id(), job.job_id());
  EXPECT_EQ(warm[0].warm_up().generation(), job.generation());
  EXPECT_EQ(warm[0].warm_up().coordinates().rank(), 1);
  EXPECT_EQ(warm[0].warm_up().mesh().members_size(), 2);
  EXPECT_EQ(warm[0].warm_up().spec().steps(), job.spec().steps());
  // Members get none.
  EXPECT_TRUE(MessagesTo(submitted, "w0", v1::CoordinatorMessage::kWarmUp).empty());
  // Nothing changed, nothing sent again.
  Effects ready;
  for (const auto& member : job.mesh().members()) {
    ASSERT_TRUE(Report(member.worker_id(), job, v1::ASSIGNMENT_STATE_READY, &ready).ok());
  }
  EXPECT_EQ(CountKind(ready, v1::CoordinatorMessage::kWarmUp), 0);
  // The job ends: the spare is released (a WarmUp without a job).
  Effects done;
  for (const auto& member : job.mesh().members()) {
    ASSERT_TRUE(Report(member.worker_id(), job, v1::ASSIGNMENT_STATE_COMPLETED, &done).ok());
  }
  warm = MessagesTo(done, spare, v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_TRUE(warm[0].warm_up().job_id().empty());
}

TEST_F(JobManagerTest, ASpareTakenIntoTheMeshIsNotReleasedAndTheNextIdleWorkerTakesItsRole) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(2, 2));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  const std::string victim = job.mesh().members(1).worker_id();
  std::string spare;
  for (const std::string id : {"w0", "w1", "w2"}) {
    if (membership_->Find(WorkerId(id))->state == WorkerState::kIdle) spare = id;
  }
  ASSERT_FALSE(spare.empty());
  Lose(victim);
  Effects effects = SuspendAll(job, /*step=*/10);
  v1::Job after = Get(job);
  ASSERT_EQ(after.generation(), 2u);
  ASSERT_EQ(after.mesh().members(1).worker_id(), spare);
  EXPECT_EQ(MessagesTo(effects, spare, v1::CoordinatorMessage::kAssign).size(), 1u);
  EXPECT_TRUE(MessagesTo(effects, spare, v1::CoordinatorMessage::kWarmUp).empty());
  // A new idle worker becomes the spare of the new generation's last place.
  Effects joined = Join("w3", "h", 3);
  auto warm = MessagesTo(joined, "w3", v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].warm_up().job_id(), after.job_id());
  EXPECT_EQ(warm[0].warm_up().generation(), 2u);
  EXPECT_EQ(warm[0].warm_up().coordinates().rank(), 1);
}

TEST_F(JobManagerTest, ASpareIsNotReleasedWhileItsJobIsSuspended) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(1, 2));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  ASSERT_EQ(job.mesh().members_size(), 2);
  std::string spare;
  for (const std::string id : {"w0", "w1", "w2"}) {
    if (membership_->Find(WorkerId(id))->state == WorkerState::kIdle) spare = id;
  }
  ASSERT_FALSE(spare.empty());
  // A member is lost: the survivor is asked to suspend, and until the plan
  // takes the spare, the spare keeps what it prepared (no release).
  Effects lost = Lose(job.mesh().members(0).worker_id());
  ASSERT_EQ(CountKind(lost, v1::CoordinatorMessage::kSuspend), 1);
  EXPECT_TRUE(MessagesTo(lost, spare, v1::CoordinatorMessage::kWarmUp).empty());
}

TEST_F(JobManagerTest, AWarmSpareLostIsReplacedByTheNextIdleWorker) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(1, 2, 2));
  job = Get(job);
  std::vector<std::string> idle;
  for (const std::string id : {"w0", "w1", "w2", "w3"}) {
    if (membership_->Find(WorkerId(id))->state == WorkerState::kIdle) idle.push_back(id);
  }
  ASSERT_EQ(idle.size(), 2u);
  // One spare per job: the first idle worker; the spare dies.
  Effects lost = Lose(idle[0]);
  auto warm = MessagesTo(lost, idle[1], v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].warm_up().job_id(), job.job_id());
  EXPECT_EQ(warm[0].warm_up().coordinates().rank(), 1);
  EXPECT_TRUE(MessagesTo(lost, idle[0], v1::CoordinatorMessage::kWarmUp).empty());
}

// Each running job has its own spare; a spare keeps its job when an idle
// worker that sorts before it arrives (its prepared session stays useful),
// and only when a job ends does its spare go to another.
TEST_F(JobManagerTest, EachJobKeepsItsOwnSpareAsIdleWorkersComeAndGo) {
  for (int i = 0; i < 6; ++i) Join(absl::StrCat("w", i), "h", i);
  const v1::Job first = Get(Submit(Spec(1, 2, 2)));
  const v1::Job second = Get(Submit(Spec(1, 2, 2)));
  ASSERT_EQ(first.mesh().members_size(), 2);
  ASSERT_EQ(second.mesh().members_size(), 2);
  std::vector<std::string> idle;
  for (int i = 0; i < 6; ++i) {
    const std::string id = absl::StrCat("w", i);
    if (membership_->Find(WorkerId(id))->state == WorkerState::kIdle) idle.push_back(id);
  }
  ASSERT_EQ(idle.size(), 2u);
  // An idle worker first in the idle order (host "a" < "h") changes no one's role.
  Effects joined = Join("early", "a", 0);
  EXPECT_EQ(CountKind(joined, v1::CoordinatorMessage::kWarmUp), 0);
  // The first job ends: its spare, and only it, is released (the second's
  // is not told again; the newcomer and the freed members stay unnamed).
  Effects done;
  for (const auto& member : first.mesh().members()) {
    ASSERT_TRUE(Report(member.worker_id(), first, v1::ASSIGNMENT_STATE_COMPLETED, &done).ok());
  }
  ASSERT_EQ(CountKind(done, v1::CoordinatorMessage::kWarmUp), 1);
  int released = 0;
  for (const std::string& id : idle) {
    for (const auto& warm : MessagesTo(done, id, v1::CoordinatorMessage::kWarmUp)) {
      EXPECT_TRUE(warm.warm_up().job_id().empty())
          << id << " named a spare of " << warm.warm_up().job_id();
      ++released;
    }
  }
  EXPECT_EQ(released, 1);
}

TEST_F(JobManagerTest, NoWarmSparesWhenTurnedOff) {
  membership_ = std::make_unique<MembershipTable>(MembershipTable::Options{});
  JobManager::Options options;
  options.warm_spares_per_job = 0;
  jobs_ = std::make_unique<JobManager>(std::move(options), membership_.get(), &store_);
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  Effects submitted;
  Submit(Spec(1, 2, 2), &submitted);
  EXPECT_EQ(CountKind(submitted, v1::CoordinatorMessage::kWarmUp), 0);
}

}  // namespace
}  // namespace cohort::coordinator::job_manager_test
