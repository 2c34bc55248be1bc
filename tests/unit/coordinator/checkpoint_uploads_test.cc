#include "coordinator/checkpoints/checkpoint_uploads.h"

#include <map>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/enum_names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/wait.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

// "pending", "committed", or the error.
std::string Result(const absl::StatusOr<bool>& r) {
  return r.ok() ? (*r ? "committed" : "pending") : r.status().ToString();
}

// Writer `writer` of two, in a (2,1,1) layout, of checkpoint `step` of
// `job_id`: one fp32 tensor "param/w" of `shape`.
v1::UploadHeader UploadHeaderOf(const std::string& job_id, uint32_t writer, uint64_t generation,
                                int64_t step, const std::vector<int64_t>& shape) {
  v1::UploadHeader h;
  h.set_job_id(job_id);
  h.set_generation(generation);
  h.set_step(step);
  h.mutable_layout()->set_data_parallel(2);
  h.mutable_layout()->set_tensor_parallel(1);
  h.mutable_layout()->set_pipeline_parallel(1);
  h.set_writer(writer);
  h.set_writers(2);
  v1::TensorInfo* t = h.add_tensors();
  t->set_name("param/w");
  t->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
  for (int64_t d : shape) t->add_global_shape(d);
  return h;
}

// An in-memory store whose disk fills up when a test says so: its writes
// then fail as RocksDbCheckpointStore's do on ENOSPC (RocksDB's IOError, as
// FromRocksDb words it).
class FullDiskStore : public InMemoryCheckpointStore {
 public:
  static absl::Status NoSpace(const std::string& action) {
    return absl::InternalError(absl::StrCat(
        "RocksDB ", action,
        " in data dir /data/checkpoints failed: IO error: No space left on device: While "
        "appending to file: /data/checkpoints/000012.blob: No space left on device"));
  }
  absl::Status BeginPending(const PendingCheckpoint& pending) override {
    if (full_markers) return NoSpace("write of the marker of " + PendingName(pending));
    return InMemoryCheckpointStore::BeginPending(pending);
  }
  absl::Status PutChunk(const PendingCheckpoint& pending, const std::string& tensor, const Box& box,
                        std::string_view bytes) override {
    if (full_chunks) {
      return NoSpace(absl::StrCat("write of a chunk of ", tensor, " for ", PendingName(pending)));
    }
    return InMemoryCheckpointStore::PutChunk(pending, tensor, box, bytes);
  }
  absl::Status Commit(const v1::CheckpointManifest& manifest) override {
    if (full_commits) return NoSpace("flush of the chunks");
    return InMemoryCheckpointStore::Commit(manifest);
  }

  // Set before the uploads run (the tests that use them are single-threaded).
  bool full_markers = false;
  bool full_chunks = false;
  bool full_commits = false;
};

// "storage job-1 step 10 generation 2 at 1000: <reason>": a reported failure.
std::string Described(const FailedCheckpoint& f) {
  return absl::StrCat(absl::AsciiStrToLower(ShortEnumName(f.kind)), " ", f.attempt.job.value(),
                      " step ", f.attempt.step.value(), " generation ",
                      f.attempt.generation.value(), " at ", absl::ToUnixSeconds(f.time), ": ",
                      f.reason);
}

// A 4 x 6 fp32 tensor "param/w" written by two writers, rows 0-1 and 2-3.
class CheckpointUploadsTest : public ::testing::Test {
 protected:
  CheckpointUploadsTest()
      : uploads_(
            &store_,
            [this](const JobId& job) -> absl::StatusOr<CheckpointJobState> {
              if (job.value() != "job-1") return absl::NotFoundError("no job " + job.value());
              return job_;
            },
            &clock_, Options()) {
    job_.generation = Generation(2);
    job_.policy.set_keep_last(2);
  }

  // Failures and commits are recorded in failures_ and commits_.
  CheckpointUploadsOptions Options() {
    CheckpointUploadsOptions options;
    options.on_failure = [this](const FailedCheckpoint& f) { failures_.push_back(Described(f)); };
    options.on_commit = [this](const CommittedCheckpoint& c) {
      commits_.push_back(absl::StrCat(PendingName(c.attempt), " at ", absl::ToUnixSeconds(c.time)));
    };
    return options;
  }

  v1::UploadHeader Header(uint32_t writer, uint64_t generation = 2, int64_t step = 10) {
    return UploadHeaderOf("job-1", writer, generation, step, {4, 6});
  }

  // Rows [row, row + rows) of the tensor, values row * 6 + column.
  static std::pair<v1::ChunkHeader, std::string> Rows(int row, int rows) {
    std::vector<float> values;
    for (int r = row; r < row + rows; ++r) {
      for (int c = 0; c < 6; ++c) values.push_back(static_cast<float>(r * 6 + c));
    }
    std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    v1::ChunkHeader h;
    h.set_tensor("param/w");
    h.mutable_box()->add_start(row);
    h.mutable_box()->add_start(0);
    h.mutable_box()->add_extent(rows);
    h.mutable_box()->add_extent(6);
    h.set_bytes(bytes.size());
    h.set_crc32c(Crc32c(bytes));
    return {h, bytes};
  }

  // Writer `w` sends rows [2w, 2w+2) and ends; returns End's result.
  absl::StatusOr<bool> WriteHalf(uint32_t w, int64_t step = 10) {
    absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> writer =
        uploads_.Begin(Header(w, 2, step));
    if (!writer.ok()) return writer.status();
    auto [chunk, bytes] = Rows(2 * static_cast<int>(w), 2);
    if (absl::Status s = (*writer)->AddChunk(chunk, bytes); !s.ok()) return s;
    v1::UploadEnd end;
    end.set_chunks(1);
    if (w == 0) (*end.mutable_objects())["model"] = "tiny";
    return (*writer)->End(end);
  }

  // Writer `w` sends rows [2w, 2w+2) without ending; returns the chunk's status.
  absl::Status StoreHalf(uint32_t w, int64_t step = 10) {
    absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> writer =
        uploads_.Begin(Header(w, 2, step));
    if (!writer.ok()) return writer.status();
    auto [chunk, bytes] = Rows(2 * static_cast<int>(w), 2);
    return (*writer)->AddChunk(chunk, bytes);
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  FullDiskStore store_;
  CheckpointJobState job_;
  std::vector<std::string> failures_;
  std::vector<std::string> commits_;
  CheckpointUploads uploads_;
};

TEST_F(CheckpointUploadsTest, TheLastWriterCommitsAndTheManifestListsEveryChunk) {
  EXPECT_EQ(Result(WriteHalf(1)), "pending");
  EXPECT_TRUE(store_.List(JobId("job-1"))->empty()) << "visible before the last writer";
  EXPECT_EQ(Result(WriteHalf(0)), "committed");
  absl::StatusOr<std::vector<v1::CheckpointManifest>> listed = store_.List(JobId("job-1"));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  const v1::CheckpointManifest& m = (*listed)[0];
  EXPECT_EQ(m.step(), 10);
  EXPECT_EQ(m.generation(), 2u);
  EXPECT_EQ(m.total_bytes(), 96);
  EXPECT_EQ(m.objects().at("model"), "tiny");
  ASSERT_EQ(m.tensors_size(), 1);
  ASSERT_EQ(m.tensors(0).chunks_size(), 2);
  EXPECT_EQ(m.tensors(0).chunks(0).box().start(0), 0);  // sorted by box start
  EXPECT_EQ(m.tensors(0).chunks(0).writer(), 0u);
  EXPECT_EQ(m.tensors(0).chunks(1).index(), 1u);
  auto reader = store_.Open(JobId("job-1"), Step(10));
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->ReadChunk(m.tensors(0), m.tensors(0).chunks(1))->view(), Rows(2, 2).second);
  EXPECT_TRUE(store_.ListPending()->empty());
  EXPECT_EQ(uploads_.counters().commits, 1);
}

// ... and is reported as a failed attempt, of kind incomplete, naming the
// tensor (Job.checkpoint_status).
TEST_F(CheckpointUploadsTest, IncompleteCoverageIsNotCommittedAndIsDropped) {
  ASSERT_EQ(Result(WriteHalf(0)), "pending");
  auto writer = uploads_.Begin(Header(1));
  ASSERT_TRUE(writer.ok());
  auto [chunk, bytes] = Rows(2, 1);  // row 3 never arrives
  ASSERT_TRUE((*writer)->AddChunk(chunk, bytes).ok());
  v1::UploadEnd end;
  end.set_chunks(1);
  absl::StatusOr<bool> ended = (*writer)->End(end);
  EXPECT_TRUE(absl::IsFailedPrecondition(ended.status())) << ended.status();
  EXPECT_THAT(ended.status().message(), HasSubstr("param/w: chunks cover 18 of its 24 elements"));
  EXPECT_TRUE(store_.List(JobId("job-1"))->empty());
  EXPECT_EQ(store_.chunk_count(), 0u);
  EXPECT_TRUE(store_.ListPending()->empty());
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_THAT(failures_[0], HasSubstr("incomplete job-1 step 10 generation 2 at 1000: "));
  EXPECT_THAT(failures_[0], HasSubstr("param/w: chunks cover 18 of its 24 elements"));
  EXPECT_TRUE(commits_.empty());
}

TEST_F(CheckpointUploadsTest, OverlappingChunksAreNotCommitted) {
  ASSERT_EQ(Result(WriteHalf(0)), "pending");
  auto writer = uploads_.Begin(Header(1));
  ASSERT_TRUE(writer.ok());
  for (int row : {1, 3}) {  // row 1 overlaps writer 0's rows 0-1; row 2 missing
    auto [chunk, bytes] = Rows(row, 1);
    ASSERT_TRUE((*writer)->AddChunk(chunk, bytes).ok());
  }
  v1::UploadEnd end;
  end.set_chunks(2);
  absl::StatusOr<bool> ended = (*writer)->End(end);
  EXPECT_THAT(ended.status().message(), HasSubstr("overlaps"));
  EXPECT_TRUE(store_.List(JobId("job-1"))->empty());
}

TEST_F(CheckpointUploadsTest, AStaleGenerationIsAbortedAtBeginAndAtCommit) {
  absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> stale = uploads_.Begin(Header(0, 1));
  EXPECT_TRUE(absl::IsAborted(stale.status())) << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("stale"));
  EXPECT_TRUE(absl::IsFailedPrecondition(uploads_.Begin(Header(0, 3)).status()));

  // Generation 2 uploads; the job moves to 3 before the last writer ends.
  ASSERT_EQ(Result(WriteHalf(1)), "pending");
  job_.generation = Generation(3);
  absl::StatusOr<bool> late = WriteHalf(0);
  EXPECT_TRUE(absl::IsAborted(late.status())) << late.status();
  EXPECT_TRUE(store_.List(JobId("job-1"))->empty());
}

TEST_F(CheckpointUploadsTest, TickAbandonsStaleAndIdleAttemptsAndFreesTheirChunks) {
  ASSERT_EQ(Result(WriteHalf(1)), "pending");
  EXPECT_EQ(store_.chunk_count(), 1u);
  uploads_.Tick();
  EXPECT_EQ(uploads_.pending_attempts(), 1);
  clock_.Advance(absl::Minutes(11));
  uploads_.Tick();
  EXPECT_EQ(uploads_.pending_attempts(), 0);
  EXPECT_EQ(store_.chunk_count(), 0u);
  EXPECT_TRUE(store_.ListPending()->empty());

  ASSERT_EQ(Result(WriteHalf(1, 20)), "pending");
  job_.generation = Generation(3);
  uploads_.Tick();
  EXPECT_EQ(uploads_.pending_attempts(), 0);
  EXPECT_EQ(store_.chunk_count(), 0u);
  EXPECT_EQ(uploads_.counters().abandoned, 2);
}

TEST_F(CheckpointUploadsTest, MalformedInputIsRefusedNamingTheField) {
  v1::UploadHeader h = Header(0);
  h.set_writers(3);
  EXPECT_THAT(uploads_.Begin(h).status().message(), HasSubstr("header.writers"));
  h = Header(5);
  EXPECT_THAT(uploads_.Begin(h).status().message(), HasSubstr("header.writer"));
  h = Header(0);
  h.mutable_tensors(0)->set_name("bad name");
  EXPECT_THAT(uploads_.Begin(h).status().message(), HasSubstr("header.tensors"));
  h = Header(0);
  h.set_job_id("job-2");
  EXPECT_TRUE(absl::IsNotFound(uploads_.Begin(h).status()));

  auto writer = uploads_.Begin(Header(0));
  ASSERT_TRUE(writer.ok());
  auto [chunk, bytes] = Rows(0, 2);
  v1::ChunkHeader other = chunk;
  other.set_tensor("param/x");
  EXPECT_THAT((*writer)->AddChunk(other, bytes).message(), HasSubstr("did not declare"));
  v1::ChunkHeader outside = chunk;
  outside.mutable_box()->set_start(0, 3);
  EXPECT_THAT((*writer)->AddChunk(outside, bytes).message(), HasSubstr("outside"));
  EXPECT_TRUE(absl::IsInvalidArgument((*writer)->AddChunk(chunk, bytes.substr(4))));
  std::string flipped = bytes;
  flipped[5] ^= 1;
  EXPECT_TRUE(absl::IsDataLoss((*writer)->AddChunk(chunk, flipped)));
  v1::UploadEnd end;
  end.set_chunks(1);
  EXPECT_THAT((*writer)->End(end).status().message(), HasSubstr("end.chunks"));

  // A second writer declaring other tensors.
  v1::UploadHeader differs = Header(1);
  differs.mutable_tensors(0)->set_global_shape(0, 8);
  EXPECT_THAT(uploads_.Begin(differs).status().message(), HasSubstr("other tensors"));
}

// Issue 21: a client started an upload with 4096 writers for a one-worker
// job; the layout (and so the writer count) must be the job's own mesh.
TEST_F(CheckpointUploadsTest, TheLayoutMustBeTheJobsMesh) {
  job_.data_parallel = 2;
  job_.tensor_parallel = 1;
  job_.pipeline_parallel = 1;
  EXPECT_TRUE(uploads_.Begin(Header(0)).ok());
  v1::UploadHeader many = Header(0, 2, 11);
  many.mutable_layout()->set_data_parallel(4096);
  many.set_writers(4096);
  absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> refused = uploads_.Begin(many);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("header.layout: 4096 x 1 x 1 is not the mesh of job job-1 generation 2 "
                        "(2 x 1 x 1)"));
}

TEST_F(CheckpointUploadsTest, ARetriedWriterReplacesItsStreamAndACommittedStepIsAlreadyExists) {
  {
    auto first = uploads_.Begin(Header(0));
    ASSERT_TRUE(first.ok());
    auto [chunk, bytes] = Rows(0, 2);
    ASSERT_TRUE((*first)->AddChunk(chunk, bytes).ok());
    // The stream breaks: the writer is destroyed without End.
  }
  ASSERT_EQ(Result(WriteHalf(0)), "pending");  // the retry
  ASSERT_EQ(Result(WriteHalf(1)), "committed");
  EXPECT_EQ(store_.chunk_count(), 2u);
  EXPECT_TRUE(absl::IsAlreadyExists(uploads_.Begin(Header(0)).status()));
}

TEST_F(CheckpointUploadsTest, ANewerCommitAbandonsOlderAttemptsAndRetentionKeepsTheNewest) {
  ASSERT_EQ(Result(WriteHalf(1, 5)), "pending");  // step 5 never completes
  for (int64_t step : {10, 20, 30}) {
    ASSERT_EQ(Result(WriteHalf(0, step)), "pending");
    ASSERT_EQ(Result(WriteHalf(1, step)), "committed");
  }
  EXPECT_EQ(uploads_.pending_attempts(), 0);
  std::vector<int64_t> steps;
  const absl::StatusOr<std::vector<v1::CheckpointManifest>> listed = store_.List(JobId("job-1"));
  ASSERT_TRUE(listed.ok());
  for (const auto& m : *listed) steps.push_back(m.step());
  EXPECT_THAT(steps, ::testing::ElementsAre(30, 20));  // keep_last 2
  EXPECT_EQ(store_.chunk_count(), 4u);
  EXPECT_EQ(uploads_.counters().retired, 1);
}

// Issue 22: Begin's synced marker write ran under the lock every chunk of
// every upload takes. Now a chunk of another upload goes ahead while a
// marker is at the disk, and the checkpoint's other writers wait for it.
class GatedMarkerStore : public InMemoryCheckpointStore {
 public:
  absl::Status BeginPending(const PendingCheckpoint& pending) override {
    {
      absl::MutexLock lock(&mu_);
      ++entered_;
      mu_.Await(absl::Condition(+[](bool* open) { return *open; }, &open_));
    }
    return InMemoryCheckpointStore::BeginPending(pending);
  }
  void set_open(bool open) {
    absl::MutexLock lock(&mu_);
    open_ = open;
  }
  int entered() {
    absl::MutexLock lock(&mu_);
    return entered_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(CheckpointUploadsMarkerTest, AMarkerAtTheDiskHoldsUpOnlyItsOwnCheckpointsWriters) {
  GatedMarkerStore store;
  FakeClock clock{absl::FromUnixSeconds(1000)};
  CheckpointJobState job;
  job.generation = Generation(2);
  CheckpointUploads uploads(
      &store, [&job](const JobId&) -> absl::StatusOr<CheckpointJobState> { return job; }, &clock);
  auto header = [](const std::string& job_id, uint32_t writer) {
    return UploadHeaderOf(job_id, writer, 2, 10, {2});
  };
  // An upload of job "other" is under way before the disk stalls.
  absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> other =
      uploads.Begin(header("other", 0));
  ASSERT_TRUE(other.ok()) << other.status();
  store.set_open(false);
  absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> first, second;
  std::thread first_thread([&] { first = uploads.Begin(header("job-1", 0)); });
  ASSERT_TRUE(testing::WaitUntil([&] { return store.entered() == 2; }, absl::Seconds(10)));
  std::thread second_thread([&] { second = uploads.Begin(header("job-1", 1)); });
  // A chunk of the other upload is stored meanwhile, on another thread so
  // that a lock held across the marker write fails the test, not hangs it.
  absl::Notification stored;
  std::thread chunk_thread([&] {
    const std::string bytes(4, '\0');
    v1::ChunkHeader chunk;
    chunk.set_tensor("param/w");
    chunk.mutable_box()->add_start(0);
    chunk.mutable_box()->add_extent(1);
    chunk.set_bytes(4);
    chunk.set_crc32c(Crc32c(bytes));
    EXPECT_TRUE((*other)->AddChunk(chunk, bytes).ok());
    stored.Notify();
  });
  EXPECT_TRUE(stored.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "a chunk waited for another checkpoint's marker";
  store.set_open(true);
  first_thread.join();
  second_thread.join();
  chunk_thread.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(store.entered(), 2) << "one marker per checkpoint";
}

// Issue 43: with the coordinator's disk full every chunk failed, the job
// trained on, and nothing but the log said so. The attempt's failure is
// reported once, with the store's words, however many chunks fail.
TEST_F(CheckpointUploadsTest, AFullDiskFailsTheAttemptOnceWithTheStoresMessage) {
  store_.full_chunks = true;
  const absl::Status first = StoreHalf(0);
  EXPECT_THAT(first.message(), HasSubstr("No space left on device"));
  clock_.Advance(absl::Seconds(5));
  EXPECT_FALSE(StoreHalf(1).ok());  // the other writer's chunk
  EXPECT_FALSE(StoreHalf(0).ok());  // a retried stream of the first
  const std::string reason =
      "RocksDB write of a chunk of param/w for job job-1 step 10 generation 2 in data dir "
      "/data/checkpoints failed: IO error: No space left on device: While appending to file: "
      "/data/checkpoints/000012.blob: No space left on device";
  EXPECT_THAT(failures_,
              ::testing::ElementsAre("storage job-1 step 10 generation 2 at 1000: " + reason));
  EXPECT_EQ(first.message(), reason) << "the writer hears what the job's record says";
  // The next checkpoint fails too: a second attempt, a second failure.
  EXPECT_FALSE(StoreHalf(0, 20).ok());
  ASSERT_EQ(failures_.size(), 2u);
  EXPECT_THAT(failures_[1], HasSubstr("storage job-1 step 20 generation 2 at 1005: "));
  // The failed attempts linger until idle; abandoning them then is no
  // second failure.
  clock_.Advance(absl::Minutes(11));
  uploads_.Tick();
  EXPECT_EQ(uploads_.pending_attempts(), 0);
  EXPECT_EQ(failures_.size(), 2u);
  // Space is freed: the next checkpoint commits, and is reported.
  store_.full_chunks = false;
  ASSERT_EQ(Result(WriteHalf(0, 30)), "pending");
  ASSERT_EQ(Result(WriteHalf(1, 30)), "committed");
  EXPECT_THAT(commits_, ::testing::ElementsAre("job job-1 step 30 generation 2 at 1665"));
  EXPECT_EQ(failures_.size(), 2u);
}

TEST_F(CheckpointUploadsTest, AMarkerTheStoreRefusesFailsTheAttemptOnceAcrossRetries) {
  store_.full_markers = true;
  EXPECT_THAT(StoreHalf(0).message(), HasSubstr("No space left on device"));
  EXPECT_FALSE(StoreHalf(1).ok());
  EXPECT_FALSE(StoreHalf(0).ok());  // each Begin tries the marker again
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_THAT(failures_[0], HasSubstr("storage job-1 step 10 generation 2 at 1000: RocksDB write "
                                      "of the marker of job job-1 step 10 generation 2"));
  EXPECT_TRUE(commits_.empty());
  // The retries succeed once there is room again.
  store_.full_markers = false;
  ASSERT_EQ(Result(WriteHalf(0)), "pending");
  ASSERT_EQ(Result(WriteHalf(1)), "committed");
  EXPECT_THAT(commits_, ::testing::ElementsAre("job job-1 step 10 generation 2 at 1000"));
  EXPECT_EQ(failures_.size(), 1u);
}

TEST_F(CheckpointUploadsTest, ACommitTheStoreRefusesIsAStorageFailure) {
  store_.full_commits = true;
  ASSERT_EQ(Result(WriteHalf(0)), "pending");
  const absl::StatusOr<bool> ended = WriteHalf(1);
  EXPECT_THAT(ended.status().message(), HasSubstr("No space left on device"));
  EXPECT_THAT(failures_, ::testing::ElementsAre(
                             "storage job-1 step 10 generation 2 at 1000: RocksDB flush of the "
                             "chunks in data dir /data/checkpoints failed: IO error: No space "
                             "left on device: While appending to file: "
                             "/data/checkpoints/000012.blob: No space left on device"));
  EXPECT_TRUE(commits_.empty());
}

TEST_F(CheckpointUploadsTest, WritersIdleWhileTheJobRunsAbandonTheAttemptAsAFailure) {
  ASSERT_EQ(Result(WriteHalf(1)), "pending");  // writer 0 never comes
  clock_.Advance(absl::Minutes(9));
  uploads_.Tick();
  EXPECT_TRUE(failures_.empty()) << "not idle for abandon_after yet";
  clock_.Advance(absl::Minutes(2));
  uploads_.Tick();
  EXPECT_THAT(failures_, ::testing::ElementsAre(
                             "abandoned job-1 step 10 generation 2 at 1660: its writers sent "
                             "nothing for 10m"));
  EXPECT_EQ(uploads_.pending_attempts(), 0);
}

// Elastic re-plans and finished jobs give attempts up all the time; none of
// that is a failure the user must hear of.
TEST_F(CheckpointUploadsTest, AttemptsTheJobMovedOnFromAreNoFailures) {
  // A newer step commits first.
  ASSERT_EQ(Result(WriteHalf(1, 5)), "pending");
  ASSERT_EQ(Result(WriteHalf(0, 10)), "pending");
  ASSERT_EQ(Result(WriteHalf(1, 10)), "committed");
  // A re-plan moves the job on: seen by Tick, and by the commit.
  ASSERT_EQ(Result(WriteHalf(1, 20)), "pending");
  job_.generation = Generation(3);
  uploads_.Tick();
  EXPECT_EQ(uploads_.pending_attempts(), 0);
  job_.generation = Generation(2);
  ASSERT_EQ(Result(WriteHalf(1, 30)), "pending");
  {
    auto writer = uploads_.Begin(Header(0, 2, 30));
    ASSERT_TRUE(writer.ok()) << writer.status();
    auto [chunk, bytes] = Rows(0, 2);
    ASSERT_TRUE((*writer)->AddChunk(chunk, bytes).ok());
    job_.generation = Generation(3);
    v1::UploadEnd end;
    end.set_chunks(1);
    const absl::StatusOr<bool> ended = (*writer)->End(end);
    EXPECT_TRUE(absl::IsAborted(ended.status())) << ended.status();
  }
  EXPECT_EQ(uploads_.pending_attempts(), 0);
  // The job finishes, or is cancelled, with an attempt under way; its
  // writers stop with it.
  job_.generation = Generation(2);
  ASSERT_EQ(Result(WriteHalf(1, 40)), "pending");
  job_.finished = true;
  clock_.Advance(absl::Minutes(11));
  uploads_.Tick();
  job_.finished = false;
  ASSERT_EQ(Result(WriteHalf(1, 50)), "pending");
  job_.accepts_checkpoints = false;
  job_.finished = true;
  clock_.Advance(absl::Minutes(11));
  uploads_.Tick();
  EXPECT_EQ(uploads_.pending_attempts(), 0);
  EXPECT_EQ(uploads_.counters().abandoned, 5);
  EXPECT_TRUE(failures_.empty()) << ::testing::PrintToString(failures_);
  EXPECT_THAT(commits_, ::testing::ElementsAre("job job-1 step 10 generation 2 at 1000"));
}

TEST(StepsToRetireTest, KeepsTheNewestAndEveryNth) {
  v1::CheckpointPolicy policy;
  policy.set_keep_last(2);
  EXPECT_THAT(StepsToRetire({10, 20, 30, 40}, policy), ::testing::ElementsAre(10, 20));
  policy.set_keep_every(20);
  EXPECT_THAT(StepsToRetire({10, 20, 30, 40, 50, 60}, policy), ::testing::ElementsAre(10, 30));
  policy.set_keep_last(0);  // the default, 3
  policy.set_keep_every(0);
  EXPECT_THAT(StepsToRetire({1, 2, 3, 4, 5}, policy), ::testing::ElementsAre(1, 2));
  EXPECT_TRUE(StepsToRetire({}, policy).empty());
}

}  // namespace
}  // namespace cohort::coordinator
