#include "coordinator/jobs/job_table.h"

#include <string>
#include <vector>

#include "common/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_specs.h"

namespace cohort::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

v1::Job Record(const std::string& id, v1::JobState state, absl::Time created) {
  v1::Job job;
  job.set_job_id(id);
  job.set_state(state);
  *job.mutable_spec() = testing::SmallJobSpec("train", 1, 1, 2);
  *job.mutable_create_time() = ToProtoTime(created);
  *job.mutable_update_time() = ToProtoTime(created);
  return job;
}

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const v1::Job& job : jobs) ids.push_back(job.job_id());
  return ids;
}

v1::Job Stored(InMemoryJobStore& store, const std::string& id) {
  absl::StatusOr<std::vector<v1::Job>> jobs = store.LoadAll();
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  if (!jobs.ok()) return v1::Job();
  for (const v1::Job& job : *jobs) {
    if (job.job_id() == id) return job;
  }
  return v1::Job();
}

class JobTableTest : public ::testing::Test {
 protected:
  JobEntry& Add(const std::string& id, int64_t number) {
    v1::Job job = Record(id, v1::JOB_STATE_PENDING, kT0);
    EXPECT_TRUE(store_.Put(job).ok());
    return table_.Add(std::move(job), number);
  }

  InMemoryJobStore store_;
  JobTable table_{JobTable::Options{}, &store_};
};

TEST_F(JobTableTest, ListsInSubmitNumberOrderWhenAddedOutOfOrder) {
  Add("b-2", 2);
  Add("a-1", 1);
  Add("c-3", 3);
  bool more = false;
  int64_t last = 0;
  EXPECT_THAT(Ids(table_.ListPage(true, 0, 10, &more, &last)), ElementsAre("a-1", "b-2", "c-3"));
  EXPECT_FALSE(more);
  EXPECT_THAT(Ids(table_.ListPage(true, 0, 2, &more, &last)), ElementsAre("a-1", "b-2"));
  EXPECT_TRUE(more);
  EXPECT_EQ(last, 2);
  EXPECT_THAT(Ids(table_.ListPage(true, last, 2, &more, &last)), ElementsAre("c-3"));
  EXPECT_THAT(table_.ActiveJobs(), ElementsAre(JobId("a-1"), JobId("b-2"), JobId("c-3")));
}

TEST_F(JobTableTest, SetStatePersistsCountsAndPublishesTheChange) {
  JobEntry& entry = Add("a-1", 1);
  Effects effects;
  table_.SetState(entry, v1::JOB_STATE_RUNNING, "started", kT0 + absl::Seconds(1), &effects);
  EXPECT_THAT(table_.CountByState(), ElementsAre(Pair(v1::JOB_STATE_RUNNING, 1)));
  ASSERT_EQ(effects.events.size(), 1u);
  EXPECT_EQ(effects.events[0].kind, v1::JOB_EVENT_KIND_STATE_CHANGED);
  EXPECT_EQ(effects.events[0].job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Stored(store_, "a-1").state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Stored(store_, "a-1").message(), "started");
}

TEST_F(JobTableTest, FailedWriteIsRetriedByWriteBehind) {
  JobEntry& entry = Add("a-1", 1);
  store_.FailNextPut(absl::UnavailableError("disk"));
  table_.SetMessage(entry, "waiting", kT0);
  EXPECT_TRUE(entry.dirty);
  EXPECT_EQ(Stored(store_, "a-1").message(), "");
  table_.WriteBehind(kT0 + absl::Milliseconds(50));
  EXPECT_FALSE(entry.dirty);
  EXPECT_EQ(Stored(store_, "a-1").message(), "waiting");
}

TEST_F(JobTableTest, LossHistoryAloneIsWrittenAtMostOncePerInterval) {
  JobEntry& entry = Add("a-1", 1);
  auto add_point = [&](int64_t step) {
    v1::LossPoint* point = entry.history.add_training();
    point->set_step(step);
    point->set_loss(1.0);
    table_.HistoryChanged(entry);
  };
  add_point(1);
  table_.WriteBehind(kT0);
  EXPECT_EQ(Stored(store_, "a-1").loss_history().training_size(), 1);
  add_point(2);
  table_.WriteBehind(kT0 + kHistoryPersistInterval - absl::Seconds(1));
  EXPECT_EQ(Stored(store_, "a-1").loss_history().training_size(), 1);
  table_.WriteBehind(kT0 + kHistoryPersistInterval);
  EXPECT_EQ(Stored(store_, "a-1").loss_history().training_size(), 2);
}

TEST_F(JobTableTest, DeletesOnlyFinishedJobsHereAndInTheStore) {
  JobEntry& entry = Add("a-1", 1);
  EXPECT_EQ(table_.Delete(JobId("a-1")).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table_.Delete(JobId("nope-9")).code(), absl::StatusCode::kNotFound);
  Effects effects;
  table_.MarkFinished(entry, kT0);
  table_.SetState(entry, v1::JOB_STATE_COMPLETED, "", kT0, &effects);
  EXPECT_THAT(table_.ActiveJobs(), IsEmpty());
  ASSERT_TRUE(table_.Delete(JobId("a-1")).ok());
  EXPECT_EQ(table_.Find(JobId("a-1")), nullptr);
  EXPECT_EQ(Stored(store_, "a-1").job_id(), "");
  EXPECT_THAT(table_.CountByState(), IsEmpty());
}

TEST_F(JobTableTest, DeleteExpiredRemovesOnlyJobsFinishedLongerThanTheRetention) {
  Effects effects;
  JobEntry& old_job = Add("old-1", 1);
  table_.MarkFinished(old_job, kT0);
  table_.SetState(old_job, v1::JOB_STATE_COMPLETED, "", kT0, &effects);
  JobEntry& new_job = Add("new-2", 2);
  table_.MarkFinished(new_job, kT0 + absl::Hours(2));
  table_.SetState(new_job, v1::JOB_STATE_FAILED, "", kT0 + absl::Hours(2), &effects);
  table_.DeleteExpired(kT0 + absl::Hours(3), absl::Hours(2));
  EXPECT_EQ(table_.Find(JobId("old-1")), nullptr);
  EXPECT_NE(table_.Find(JobId("new-2")), nullptr);
  table_.DeleteExpired(kT0 + absl::Hours(3), absl::ZeroDuration());  // zero: kept
  EXPECT_NE(table_.Find(JobId("new-2")), nullptr);
}

TEST_F(JobTableTest, LoadRestoresInCreationOrderAndReturnsTheUnfinishedJobs) {
  v1::Job done = Record("z-1", v1::JOB_STATE_COMPLETED, kT0);
  v1::LossPoint* point = done.mutable_loss_history()->add_validation();
  point->set_step(10);
  point->set_loss(2.5);
  ASSERT_TRUE(store_.Put(done).ok());
  ASSERT_TRUE(store_.Put(Record("a-3", v1::JOB_STATE_RUNNING, kT0 + absl::Seconds(2))).ok());
  ASSERT_TRUE(store_.Put(Record("m-2", v1::JOB_STATE_PENDING, kT0 + absl::Seconds(1))).ok());
  absl::StatusOr<std::vector<JobId>> active = table_.Load();
  ASSERT_TRUE(active.ok()) << active.status();
  EXPECT_THAT(*active, ElementsAre(JobId("m-2"), JobId("a-3")));
  bool more = false;
  int64_t last = 0;
  EXPECT_THAT(Ids(table_.ListPage(true, 0, 10, &more, &last)), ElementsAre("z-1", "m-2", "a-3"));
  // The loss history is kept out of the job every reply copies.
  EXPECT_FALSE(table_.At(JobId("z-1")).job.has_loss_history());
  EXPECT_THAT(table_.LatestValidationLosses(), ElementsAre(Pair("z-1", 2.5)));
  EXPECT_THAT(table_.CountByState(),
              ElementsAre(Pair(v1::JOB_STATE_PENDING, 1), Pair(v1::JOB_STATE_RUNNING, 1),
                          Pair(v1::JOB_STATE_COMPLETED, 1)));
}

}  // namespace
}  // namespace cohort::coordinator
