#include "coordinator/jobs/job_store.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

v1::Job MakeJob(const std::string& id, int64_t step) {
  v1::Job job;
  job.set_job_id(id);
  job.mutable_progress()->set_step(step);
  return job;
}

TEST(InMemoryJobStoreTest, LoadAllReturnsLatestRecordsInJobIdOrder) {
  InMemoryJobStore store;
  ASSERT_TRUE(store.Put(MakeJob("b", 1)).ok());
  ASSERT_TRUE(store.Put(MakeJob("a", 1)).ok());
  ASSERT_TRUE(store.Put(MakeJob("b", 2)).ok());
  absl::StatusOr<std::vector<v1::Job>> jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job_id(), "a");
  EXPECT_EQ((*jobs)[1].job_id(), "b");
  EXPECT_EQ((*jobs)[1].progress().step(), 2);
}

TEST(InMemoryJobStoreTest, NextJobNumberCountsFromOne) {
  InMemoryJobStore store;
  EXPECT_EQ(*store.NextJobNumber(), 1);
  EXPECT_EQ(*store.NextJobNumber(), 2);
  EXPECT_EQ(*store.NextJobNumber(), 3);
}

TEST(InMemoryJobStoreTest, FailNextPutFailsExactlyOnePutAndStoresNothing) {
  InMemoryJobStore store;
  ASSERT_TRUE(store.Put(MakeJob("a", 1)).ok());
  store.FailNextPut(absl::UnavailableError("disk gone"));

  absl::Status failed = store.Put(MakeJob("a", 2));
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed.message(), "disk gone");
  EXPECT_EQ(store.LoadAll()->at(0).progress().step(), 1);

  ASSERT_TRUE(store.Put(MakeJob("a", 3)).ok());
  EXPECT_EQ(store.LoadAll()->at(0).progress().step(), 3);
}

TEST(InMemoryJobStoreTest, PutRejectsEmptyJobId) {
  InMemoryJobStore store;
  EXPECT_EQ(store.Put(v1::Job()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::coordinator
