#include "coordinator/store/rocksdb_job_store.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "tests/testing/paths.h"

namespace cohort::coordinator {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

// A job with every nested message populated, so a lossy round trip shows.
v1::Job MakeJob(const std::string& id, int64_t step) {
  v1::Job job;
  job.set_job_id(id);
  v1::JobSpec* spec = job.mutable_spec();
  spec->set_name(absl::StrCat("name-", id));
  spec->set_device_kind(v1::DEVICE_KIND_GPU);
  spec->mutable_model()->set_layers(4);
  spec->mutable_model()->set_heads(8);
  spec->mutable_model()->set_width(256);
  spec->mutable_data()->mutable_synthetic()->set_seed(42);
  spec->mutable_optimizer()->set_learning_rate(3e-4);
  spec->mutable_parallelism()->set_tensor(2);
  spec->mutable_parallelism()->set_zero1(true);
  spec->set_steps(1000);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_generation(7);
  job.mutable_mesh()->set_data_parallel(2);
  job.mutable_mesh()->set_tensor_parallel(2);
  for (int rank = 0; rank < 4; ++rank) {
    v1::MeshMember* member = job.mutable_mesh()->add_members();
    member->set_worker_id(absl::StrCat("w", rank));
    member->set_incarnation(1000 + rank);
    member->set_host("127.0.0.1");
    member->mutable_coordinates()->set_rank(rank);
    member->mutable_coordinates()->set_data(rank / 2);
    member->mutable_coordinates()->set_tensor(rank % 2);
  }
  job.mutable_progress()->set_step(step);
  job.mutable_progress()->set_loss(2.5);
  job.set_message("training");
  job.mutable_create_time()->set_seconds(1'700'000'000);
  job.mutable_update_time()->set_nanos(123);
  job.set_ready_workers(4);
  return job;
}

void ExpectJobsEqual(const std::vector<v1::Job>& actual, const std::vector<v1::Job>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals(actual[i], expected[i]))
        << "job " << i << ":\n"
        << actual[i].DebugString() << "expected:\n"
        << expected[i].DebugString();
  }
}

std::unique_ptr<RocksDbJobStore> OpenOrDie(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<RocksDbJobStore>> store = RocksDbJobStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

// Writes `value` under `key` in the "jobs" family with plain RocksDB, the way
// a bug or a damaged disk would, while no store has the directory open.
void WriteRawJobsRecord(const std::string& dir, const std::string& key, const std::string& value) {
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {"jobs", rocksdb::ColumnFamilyOptions()}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status opened = rocksdb::DB::Open(rocksdb::DBOptions(), dir, families, &handles, &db);
  ASSERT_TRUE(opened.ok()) << opened.ToString();
  EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), handles[1], key, value).ok());
  for (rocksdb::ColumnFamilyHandle* handle : handles) {
    EXPECT_TRUE(db->DestroyColumnFamilyHandle(handle).ok());
  }
  EXPECT_TRUE(db->Close().ok());
  delete db;
}

TEST(RocksDbJobStoreTest, OpenCreatesMissingDirectories) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store") + "/a/b/data";
  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(dir);
  ASSERT_NE(store, nullptr);
  ASSERT_NE(store->db(), nullptr);
  absl::StatusOr<std::vector<v1::Job>> jobs = store->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty());
}

TEST(RocksDbJobStoreTest, PutAndLoadAllRoundTripInJobIdOrder) {
  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(testing::MakeTempDir("rocksdb_job_store"));
  ASSERT_NE(store, nullptr);
  const v1::Job b = MakeJob("job-b", 20), a = MakeJob("job-a", 10), c = MakeJob("job-c", 30);
  for (const v1::Job& job : {b, c, a}) ASSERT_TRUE(store->Put(job).ok());
  // The counter lives in the same family but is not a job.
  ASSERT_TRUE(store->NextJobNumber().ok());

  absl::StatusOr<std::vector<v1::Job>> jobs = store->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ExpectJobsEqual(*jobs, {a, b, c});
}

TEST(RocksDbJobStoreTest, PutOverwritesEarlierRecord) {
  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(testing::MakeTempDir("rocksdb_job_store"));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(MakeJob("job-a", 1)).ok());
  v1::Job updated = MakeJob("job-a", 99);
  updated.set_state(v1::JOB_STATE_COMPLETED);
  updated.clear_mesh();
  ASSERT_TRUE(store->Put(updated).ok());

  absl::StatusOr<std::vector<v1::Job>> jobs = store->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ExpectJobsEqual(*jobs, {updated});
}

TEST(RocksDbJobStoreTest, PutRejectsEmptyJobId) {
  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(testing::MakeTempDir("rocksdb_job_store"));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Put(v1::Job()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RocksDbJobStoreTest, ReopenKeepsJobsAndCounterContinues) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store");
  const v1::Job a = MakeJob("job-a", 5), b = MakeJob("job-b", 6);
  {
    std::unique_ptr<RocksDbJobStore> store = OpenOrDie(dir);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(*store->NextJobNumber(), 1);
    EXPECT_EQ(*store->NextJobNumber(), 2);
    ASSERT_TRUE(store->Put(a).ok());
    ASSERT_TRUE(store->Put(b).ok());
  }
  std::unique_ptr<RocksDbJobStore> reopened = OpenOrDie(dir);
  ASSERT_NE(reopened, nullptr);
  absl::StatusOr<std::vector<v1::Job>> jobs = reopened->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ExpectJobsEqual(*jobs, {a, b});
  absl::StatusOr<int64_t> next = reopened->NextJobNumber();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 3);
}

TEST(RocksDbJobStoreTest, ConcurrentNextJobNumberHandsOutDistinctNumbers) {
  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(testing::MakeTempDir("rocksdb_job_store"));
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 4, kPerThread = 25;
  std::vector<std::vector<int64_t>> numbers(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, &numbers, t] {
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<int64_t> n = store->NextJobNumber();
        numbers[t].push_back(n.ok() ? *n : -1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<int64_t> distinct;
  for (const auto& per_thread : numbers) distinct.insert(per_thread.begin(), per_thread.end());
  ASSERT_EQ(distinct.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(*distinct.begin(), 1);
  EXPECT_EQ(*distinct.rbegin(), kThreads * kPerThread);
}

TEST(RocksDbJobStoreTest, SecondOpenOfLockedDirIsUnavailable) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store");
  std::unique_ptr<RocksDbJobStore> first = OpenOrDie(dir);
  ASSERT_NE(first, nullptr);

  absl::StatusOr<std::unique_ptr<RocksDbJobStore>> second = RocksDbJobStore::Open(dir);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("another coordinator"));
  EXPECT_THAT(second.status().message(), HasSubstr(dir));

  // The destructor releases the lock.
  first.reset();
  EXPECT_NE(OpenOrDie(dir), nullptr);
}

TEST(RocksDbJobStoreTest, OpenFailsWhenDataDirIsAFile) {
  const std::string path = testing::MakeTempDir("rocksdb_job_store") + "/file";
  std::ofstream(path) << "not a directory";
  absl::StatusOr<std::unique_ptr<RocksDbJobStore>> store = RocksDbJobStore::Open(path);
  EXPECT_FALSE(store.ok());
  EXPECT_NE(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

TEST(RocksDbJobStoreTest, UnparsableRecordIsDataLossNamingTheKey) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store");
  {
    std::unique_ptr<RocksDbJobStore> store = OpenOrDie(dir);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(MakeJob("job-a", 1)).ok());
  }
  // Field 1 (job_id) claims 5 bytes but only 2 follow: never parses.
  WriteRawJobsRecord(dir, "job/broken",
                     std::string("\x0a\x05"
                                 "ab",
                                 4));

  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(dir);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<v1::Job>> jobs = store->LoadAll();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kDataLoss) << jobs.status();
  EXPECT_THAT(jobs.status().message(), HasSubstr("job/broken"));
  EXPECT_THAT(jobs.status().message(), HasSubstr(dir));
}

TEST(RocksDbJobStoreTest, RecordUnderAnotherJobsKeyIsDataLoss) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store");
  { ASSERT_NE(OpenOrDie(dir), nullptr); }
  WriteRawJobsRecord(dir, "job/x", MakeJob("job-y", 1).SerializeAsString());
  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(dir);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<v1::Job>> jobs = store->LoadAll();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(jobs.status().message(), HasSubstr("job/x"));
}

TEST(RocksDbJobStoreTest, CorruptCounterIsDataLoss) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store");
  { ASSERT_NE(OpenOrDie(dir), nullptr); }
  WriteRawJobsRecord(dir, "meta/next_job_number", "seven");
  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(dir);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<int64_t> next = store->NextJobNumber();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(next.status().message(), HasSubstr("meta/next_job_number"));
}

TEST(RocksDbJobStoreTest, ReopenWithColumnFamilyAddedByAnotherUser) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store");
  {
    std::unique_ptr<RocksDbJobStore> store = OpenOrDie(dir);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(MakeJob("job-a", 1)).ok());
    rocksdb::ColumnFamilyHandle* extra = nullptr;
    ASSERT_TRUE(store->db()
                    ->CreateColumnFamily(rocksdb::ColumnFamilyOptions(), "checkpoints", &extra)
                    .ok());
    ASSERT_TRUE(store->db()->DestroyColumnFamilyHandle(extra).ok());
  }
  std::unique_ptr<RocksDbJobStore> reopened = OpenOrDie(dir);
  ASSERT_NE(reopened, nullptr);
  absl::StatusOr<std::vector<v1::Job>> jobs = reopened->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 1u);
}

// Waits up to 30 s for `fd` to be readable or hung up; false on timeout.
bool WaitReadable(int fd) {
  pollfd entry{.fd = fd, .events = POLLIN, .revents = 0};
  int ready;
  do {
    ready = poll(&entry, 1, /*timeout_ms=*/30'000);
  } while (ready < 0 && errno == EINTR);
  return ready > 0;
}

// Reaps `pid`. `exit_fd` is the read end of a pipe only the child writes to:
// it hangs up when the child dies, which bounds the wait without sleeping.
// A child still running after the bound is killed. Returns the wait status.
int ReapChild(pid_t pid, int exit_fd) {
  char byte;
  bool exited = false;
  while (WaitReadable(exit_fd)) {
    if (read(exit_fd, &byte, 1) <= 0) {
      exited = true;
      break;
    }
  }
  if (!exited) {
    ADD_FAILURE() << "child " << pid << " did not exit within 30 s; killing it";
    kill(pid, SIGKILL);
  }
  close(exit_fd);
  int wait_status = 0;
  EXPECT_EQ(waitpid(pid, &wait_status, 0), pid);
  return wait_status;
}

// The lock held by another process (the real "second coordinator" case; the
// test above covers a second open inside one process, which RocksDB words
// differently).
TEST(RocksDbJobStoreTest, OpenWhileAnotherProcessHoldsTheDirIsUnavailable) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store");
  int ready_pipe[2], release_pipe[2];
  ASSERT_EQ(pipe(ready_pipe), 0);
  ASSERT_EQ(pipe(release_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork failed, errno " << errno;
  if (pid == 0) {
    close(ready_pipe[0]);
    close(release_pipe[1]);
    absl::StatusOr<std::unique_ptr<RocksDbJobStore>> store = RocksDbJobStore::Open(dir);
    if (!store.ok()) _exit(2);
    if (write(ready_pipe[1], "r", 1) != 1) _exit(3);
    char byte;
    // Returns 0 once the parent closes its end (or dies).
    while (read(release_pipe[0], &byte, 1) > 0) {
    }
    _exit(0);  // no destructors: the kernel drops the lock with the process
  }
  close(ready_pipe[1]);
  close(release_pipe[0]);
  char byte = 0;
  const bool child_ready = WaitReadable(ready_pipe[0]) && read(ready_pipe[0], &byte, 1) == 1;

  absl::StatusOr<std::unique_ptr<RocksDbJobStore>> store = RocksDbJobStore::Open(dir);
  close(release_pipe[1]);
  const int wait_status = ReapChild(pid, ready_pipe[0]);
  ASSERT_TRUE(child_ready) << "child could not open the store; wait status " << wait_status;
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;

  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("another coordinator"));
  EXPECT_THAT(store.status().message(), HasSubstr(dir));
  // Once the other process is gone the directory opens again.
  EXPECT_NE(OpenOrDie(dir), nullptr);
}

// kill -9 durability: a child process opens the store, writes, and dies by
// SIGKILL without running any destructor or Close; the parent then finds the
// write. (Power-loss durability rests on WriteOptions::sync, not shown here.)
TEST(RocksDbJobStoreTest, PutSurvivesSigkillWithoutClose) {
  const std::string dir = testing::MakeTempDir("rocksdb_job_store");
  const v1::Job job = MakeJob("job-killed", 17);

  // The child holds the write end; it closes when the child dies, which lets
  // the parent wait with a bound and without sleeping.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork failed, errno " << errno;
  if (pid == 0) {
    // Child: gtest assertions would not reach the parent, so every failure
    // becomes a distinct exit code instead.
    close(pipe_fds[0]);
    absl::StatusOr<std::unique_ptr<RocksDbJobStore>> store = RocksDbJobStore::Open(dir);
    if (!store.ok()) _exit(2);
    if (!(*store)->Put(job).ok()) _exit(3);
    absl::StatusOr<int64_t> number = (*store)->NextJobNumber();
    if (!number.ok() || *number != 1) _exit(4);
    raise(SIGKILL);
    _exit(5);
  }
  close(pipe_fds[1]);
  const int wait_status = ReapChild(pid, pipe_fds[0]);
  ASSERT_TRUE(WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL)
      << "child exited with code " << (WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1);

  std::unique_ptr<RocksDbJobStore> store = OpenOrDie(dir);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<v1::Job>> jobs = store->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ExpectJobsEqual(*jobs, {job});
  EXPECT_EQ(*store->NextJobNumber(), 2);
}

}  // namespace
}  // namespace cohort::coordinator
