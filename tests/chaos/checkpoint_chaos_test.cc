// kill -9 the coordinator at random moments while checkpoints are being
// uploaded and committed, 24 times: after every restart each listed
// checkpoint reads back whole (every chunk present, checksums valid, the
// chunks tiling every tensor, the values those the writers sent) and no
// partial checkpoint is ever listed. Uploads come from two writer threads of
// this test (a dp=2 layout of a small GPT's state with synthetic values)
// against a job that two idle workers keep RUNNING; uploads cut by a kill
// fail and the next step's checkpoint starts over.

#include <atomic>
#include <map>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/checkpoint_client.h"
#include "common/box.h"
#include "common/box_proto.h"
#include "coordinator/checkpoints/checkpoint_coverage.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/synthetic_checkpoint.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/train/data_parallel.h"

namespace cohort::testing {
namespace {

constexpr int kKills = 24;

// Uploads checkpoints of steps 1, 2, ... from two writers until stopped.
class Uploader {
 public:
  Uploader(LocalCluster* cluster, std::string job_id)
      : cluster_(cluster), job_id_(std::move(job_id)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Uploader() {
    stop_ = true;
    thread_.join();
  }
  int64_t committed() const { return committed_.load(); }
  // Writer uploads that ended (either way); odd: one writer of the current
  // checkpoint is done and the other's end, and so the commit, is imminent.
  int64_t writer_results() const { return writer_results_.load(); }
  int64_t failed() const { return failed_.load(); }
  // Holds the uploads (after the one in flight ends) so the store stands
  // still while it is verified; retention would otherwise retire listed
  // checkpoints under the reader.
  // (Retention after a commit's reply may still run; VerifyListed allows
  // for that.)
  void Pause() {
    absl::MutexLock lock(&mu_);
    paused_ = true;
    mu_.Await(absl::Condition(&idle_));
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    paused_ = false;
  }

 private:
  void Loop() {
    auto client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(cluster_->address()));
    // Its own stub: the main thread's restarts replace the cluster's (the
    // address stays the same).
    auto jobs = v1::Jobs::NewStub(
        grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials()));
    int64_t step = 0;
    while (!stop_) {
      {
        absl::MutexLock lock(&mu_);
        idle_ = true;
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](bool* paused) { return !*paused; }, &paused_),
                             absl::Milliseconds(100));
        if (paused_) continue;
        idle_ = false;
      }
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::GetJobRequest request;
      request.set_job_id(job_id_);
      absl::StatusOr<v1::Job> job = v1::Job();
      if (grpc::Status got = jobs->Get(&context, request, &*job); !got.ok()) {
        job = FromGrpcStatus(got);
      }
      if (!job.ok()) {  // the coordinator is down: try again shortly
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      ++step;
      const SyntheticUpload upload =
          UploadSynthetic(client.get(), job_id_, job->generation(), step, /*dp=*/2,
                          [this](const checkpoint::UploadResult&) { ++writer_results_; });
      (upload.all_ok && upload.committed ? committed_ : failed_)++;
    }
  }

  LocalCluster* cluster_;
  const std::string job_id_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool idle_ ABSL_GUARDED_BY(mu_) = true;
  std::atomic<int64_t> committed_{0};
  std::atomic<int64_t> failed_{0};
  std::atomic<int64_t> writer_results_{0};
  std::thread thread_;
};

// A listed checkpoint that reads as NotFound must have been retired since
// it was listed: retention runs after a commit's reply (queued behind chunk
// I/O), so an older checkpoint listed a moment ago may be gone by the time
// its manifest or its chunks are read. It must then be gone from the list,
// and a newer checkpoint must be there.
void ExpectRetiredSinceListed(client::CheckpointClient* client, const std::string& job_id,
                              int64_t step, const absl::Status& read) {
  absl::StatusOr<v1::ListCheckpointsResponse> again = client->List(job_id, absl::Seconds(10));
  ASSERT_TRUE(again.ok()) << again.status();
  bool still_listed = false;
  int64_t newest = -1;
  for (const v1::CheckpointSummary& s : again->checkpoints()) {
    still_listed |= s.step() == step;
    newest = std::max(newest, s.step());
  }
  EXPECT_FALSE(still_listed) << "listed but unreadable: " << read;
  EXPECT_GT(newest, step) << "retired without a newer checkpoint";
}

// Reads back every listed checkpoint whole; returns how many it read (the
// listed ones less those retired meanwhile).
int VerifyListed(const std::string& address, const std::string& job_id) {
  auto client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(address));
  absl::StatusOr<v1::ListCheckpointsResponse> listed = client->List(job_id, absl::Seconds(10));
  EXPECT_TRUE(listed.ok()) << listed.status();
  if (!listed.ok()) return 0;
  int verified = 0;
  for (const v1::CheckpointSummary& summary : listed->checkpoints()) {
    SCOPED_TRACE(absl::StrCat("step ", summary.step()));
    absl::StatusOr<v1::CheckpointManifest> manifest =
        client->GetManifest(job_id, summary.step(), absl::Seconds(10));
    if (absl::IsNotFound(manifest.status())) {
      ExpectRetiredSinceListed(client.get(), job_id, summary.step(), manifest.status());
      continue;
    }
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    if (!manifest.ok()) continue;
    std::map<std::string, std::vector<Box>> boxes;
    int64_t chunks = 0;
    absl::Status read = client->Download(
        job_id, summary.step(), {},
        [&](const std::string& tensor, const v1::ChunkInfo& info, std::string_view bytes) {
          ++chunks;
          boxes[tensor].push_back(BoxFromProto(info.box()));
          return CheckSyntheticChunk(summary.step(), tensor, info, bytes);
        },
        absl::Seconds(30));
    // A download reads one snapshot of the store: retired before it opened,
    // it finds nothing; once open it reads every chunk.
    if (absl::IsNotFound(read) && chunks == 0) {
      ExpectRetiredSinceListed(client.get(), job_id, summary.step(), read);
      continue;
    }
    EXPECT_TRUE(read.ok()) << read;
    for (const v1::TensorInfo& t : manifest->tensors()) {
      const std::vector<int64_t> shape(t.global_shape().begin(), t.global_shape().end());
      const absl::Status covered = coordinator::CheckCoverage(t.name(), shape, boxes[t.name()]);
      EXPECT_TRUE(covered.ok()) << covered;
    }
    ++verified;
  }
  return verified;
}

TEST(CheckpointChaosTest, KillingTheCoordinatorNeverLeavesAPartialCheckpointListed) {
  LocalCluster cluster("ckpt-chaos");
  cluster.StartCoordinator("60s");  // the job keeps its generation across restarts
  ASSERT_NE(cluster.StartWorker("w0", "host", 0), nullptr);
  ASSERT_NE(cluster.StartWorker("w1", "host", 1), nullptr);
  cluster.WaitForIdleWorkers(2);
  v1::JobSpec spec = LocalCluster::Spec(1, 2, 2);
  spec.set_name("chaos");
  spec.mutable_checkpoint()->set_interval_steps(1);
  spec.mutable_checkpoint()->set_keep_last(4);
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  cluster.WaitForJob(job->job_id(), [](const v1::Job& j) { return LocalCluster::RunningAndReady(j, 2); },
                     absl::Seconds(30), "the job to run");

  std::mt19937 rng(20261203);
  Uploader uploader(&cluster, job->job_id());
  int listed_total = 0;
  int in_commit = 0;
  for (int kill = 0; kill < kKills; ++kill) {
    SCOPED_TRACE(absl::StrCat("kill ", kill));
    // Let uploads run until one more commits (so every kill comes after a
    // commit of its own, however slow a loaded machine makes the uploads),
    // then kill at a random moment of the next ones.
    const int64_t before = uploader.committed();
    ASSERT_TRUE(WaitUntil([&] { return uploader.committed() > before; }, absl::Seconds(60)))
        << "no upload committed after the restart (" << uploader.failed() << " cut short)";
    if (kill % 2 == 0) {
      // Anywhere in the upload.
      absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 120)(rng)));
    } else {
      // Aimed at the commit: just after the first writer of a checkpoint ended.
      const int64_t seen = uploader.writer_results();
      ASSERT_TRUE(WaitUntil([&] { const int64_t n = uploader.writer_results();
                                  return n > seen && n % 2 == 1; },
                            absl::Seconds(30), absl::Microseconds(50)));
      absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 3000)(rng)));
    }
    cluster.coordinator()->Kill();
    ASSERT_TRUE(cluster.coordinator()->Wait(absl::Seconds(10)).ok());
    // Did the kill land inside a commit (begun, not finished)?
    const std::string log = cluster.coordinator()->ReadLog();
    const size_t begun = log.rfind("committing the checkpoint");
    const size_t done = log.rfind("committed the checkpoint");
    if (begun != std::string::npos && (done == std::string::npos || done < begun)) ++in_commit;
    cluster.StartCoordinator("60s");
    uploader.Pause();
    listed_total += VerifyListed(cluster.address(), job->job_id());
    uploader.Resume();
  }
  std::printf("%d kills (%d inside a commit): %lld checkpoints committed, %lld uploads cut "
              "short; %d listed checkpoints read back whole after the restarts\n",
              kKills, in_commit, static_cast<long long>(uploader.committed()),
              static_cast<long long>(uploader.failed()), listed_total);
  EXPECT_GE(uploader.committed(), kKills) << "too few commits for the kills to land among them";
  EXPECT_GT(uploader.failed(), 0) << "no kill interrupted an upload";
}

}  // namespace
}  // namespace cohort::testing
