// JobPersister (issue 22): job records are queued under the coordinator's
// lock and written after it with group commit; the facade never waits on
// the disk while it holds its mutex, and what it tells workers and clients
// is durable first.

#include "coordinator/jobs/job_persister.h"

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_specs.h"
#include "tests/testing/wait.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

v1::Job Record(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_job_id(id);
  job.set_state(state);
  return job;
}

// An in-memory store whose batched writes can be held at the disk.
class GatedStore : public InMemoryJobStore {
 public:
  absl::Status Write(const std::vector<JobWrite>& writes) override {
    {
      absl::MutexLock lock(&mu_);
      ++writes_entered_;
      batch_sizes_.push_back(writes.size());
      mu_.Await(absl::Condition(+[](bool* open) { return *open; }, &open_));
    }
    return InMemoryJobStore::Write(writes);
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  int writes_entered() {
    absl::MutexLock lock(&mu_);
    return writes_entered_;
  }
  std::vector<size_t> batch_sizes() {
    absl::MutexLock lock(&mu_);
    return batch_sizes_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int writes_entered_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> batch_sizes_ ABSL_GUARDED_BY(mu_);
};

std::map<std::string, v1::JobState> States(JobStore& store) {
  std::map<std::string, v1::JobState> states;
  absl::StatusOr<std::vector<v1::Job>> jobs = store.LoadAll();
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  if (!jobs.ok()) return states;
  for (const v1::Job& job : *jobs) states[job.job_id()] = job.state();
  return states;
}

TEST(JobPersisterTest, QueuedRecordsReachTheStoreOnlyWhenFlushedNewestFirst) {
  InMemoryJobStore durable;
  JobPersister persister(&durable);
  ASSERT_TRUE(persister.Put(Record("a-1", v1::JOB_STATE_PENDING)).ok());
  ASSERT_TRUE(persister.Put(Record("a-1", v1::JOB_STATE_RUNNING)).ok());
  ASSERT_TRUE(persister.Put(Record("b-2", v1::JOB_STATE_RUNNING)).ok());
  EXPECT_TRUE(States(durable).empty()) << "a queued record is not on disk yet";
  EXPECT_EQ(persister.last_ticket(), 3u);
  ASSERT_TRUE(persister.Flush(persister.last_ticket()).ok());
  EXPECT_EQ(States(durable), (std::map<std::string, v1::JobState>{
                                 {"a-1", v1::JOB_STATE_RUNNING}, {"b-2", v1::JOB_STATE_RUNNING}}));
  EXPECT_EQ(persister.counters().batches, 1u);
  EXPECT_EQ(persister.counters().records, 2u) << "a-1's older record was replaced in the queue";
  // A delete replaces a queued put of the same job.
  ASSERT_TRUE(persister.Put(Record("b-2", v1::JOB_STATE_COMPLETED)).ok());
  ASSERT_TRUE(persister.Delete("b-2").ok());
  ASSERT_TRUE(persister.Flush(persister.last_ticket()).ok());
  EXPECT_EQ(States(durable), (std::map<std::string, v1::JobState>{{"a-1", v1::JOB_STATE_RUNNING}}));
  // Nothing new: a flush writes nothing.
  ASSERT_TRUE(persister.Flush(persister.last_ticket()).ok());
  EXPECT_EQ(persister.counters().batches, 2u);
  EXPECT_FALSE(persister.Put(v1::Job()).ok()) << "a record without a job id";
}

TEST(JobPersisterTest, AFailedBatchStaysQueuedAndIsRetried) {
  InMemoryJobStore durable;
  JobPersister persister(&durable);
  ASSERT_TRUE(persister.Put(Record("a-1", v1::JOB_STATE_RUNNING)).ok());
  durable.FailNextPut(absl::UnavailableError("disk full"));
  const absl::Status failed = persister.Flush(persister.last_ticket());
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.message(), HasSubstr("disk full"));
  EXPECT_THAT(failed.message(), HasSubstr("not yet durable"));
  EXPECT_TRUE(States(durable).empty());
  ASSERT_TRUE(persister.Flush(persister.last_ticket()).ok()) << "retried";
  EXPECT_EQ(States(durable), (std::map<std::string, v1::JobState>{{"a-1", v1::JOB_STATE_RUNNING}}));
  EXPECT_EQ(persister.counters().failures, 1u);
}

TEST(JobPersisterTest, CallersThatArriveDuringAWriteShareTheNextBatch) {
  GatedStore durable;
  JobPersister persister(&durable);
  ASSERT_TRUE(persister.Put(Record("a-1", v1::JOB_STATE_RUNNING)).ok());
  durable.Close();
  std::thread first([&] { EXPECT_TRUE(persister.Flush(1).ok()); });
  ASSERT_TRUE(testing::WaitUntil([&] { return durable.writes_entered() == 1; },
                                 absl::Seconds(10)));
  // While the first batch is at the disk, three more changes and flushers.
  std::vector<std::thread> later;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(persister.Put(Record(absl::StrCat("j-", i), v1::JOB_STATE_RUNNING)).ok());
    const uint64_t ticket = persister.last_ticket();
    later.emplace_back([&persister, ticket] { EXPECT_TRUE(persister.Flush(ticket).ok()); });
  }
  durable.Open();
  first.join();
  for (std::thread& t : later) t.join();
  EXPECT_EQ(durable.batch_sizes(), (std::vector<size_t>{1, 3})) << "one batch for the three";
  EXPECT_EQ(States(durable).size(), 4u);
}

// The facade: with the disk held, a heartbeat is still answered (nothing
// under the mutex waits for the disk), while the Cancel that changed the
// job is acknowledged only once its record is durable.
TEST(JobPersisterTest, TheCoordinatorAnswersHeartbeatsWhileAJobWriteWaitsForTheDisk) {
  auto store = std::make_unique<GatedStore>();
  GatedStore* durable = store.get();
  FakeClock clock;
  CoordinatorMetrics metrics(std::make_shared<prometheus::Registry>());
  Coordinator::Options options;
  auto coordinator = Coordinator::Create(options, std::move(store), &clock, &metrics);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  Coordinator& c = **coordinator;
  struct NullSink : WorkerSink {
    void Send(v1::CoordinatorMessage) override {}
  };
  v1::Hello hello;
  hello.set_worker_id("w0");
  hello.set_host("h");
  hello.set_device_kind(v1::DEVICE_KIND_CPU);
  hello.set_incarnation(7);
  ASSERT_TRUE(c.Attach(hello, std::make_shared<NullSink>()).ok());
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = testing::SmallJobSpec("gated", 1, 2, 2);  // waits for a 2nd worker
  absl::StatusOr<v1::Job> job = c.Submit(submit);
  ASSERT_TRUE(job.ok()) << job.status();

  durable->Close();
  const int entered = durable->writes_entered();
  absl::Notification cancelled;
  std::thread cancel([&] {
    EXPECT_TRUE(c.Cancel(JobId(job->job_id())).ok());
    cancelled.Notify();
  });
  ASSERT_TRUE(testing::WaitUntil([&] { return durable->writes_entered() > entered; },
                                 absl::Seconds(10)));
  // On another thread, so that a coordinator that did wait would fail the
  // test rather than hang it.
  absl::Notification answered;
  std::thread heartbeat([&] {
    v1::WorkerMessage message;
    message.set_incarnation(7);
    message.mutable_heartbeat()->set_sequence(1);
    EXPECT_TRUE(c.OnWorkerMessage(WorkerId("w0"), message).ok());
    EXPECT_EQ(c.GetJob(JobId(job->job_id()))->state(), v1::JOB_STATE_CANCELLED);
    answered.Notify();
  });
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "a heartbeat waited for the disk";
  EXPECT_FALSE(cancelled.HasBeenNotified()) << "acknowledged before its record was durable";
  EXPECT_EQ(States(*durable)[job->job_id()], v1::JOB_STATE_PENDING);
  durable->Open();
  heartbeat.join();
  cancel.join();
  EXPECT_EQ(States(*durable)[job->job_id()], v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace cohort::coordinator
