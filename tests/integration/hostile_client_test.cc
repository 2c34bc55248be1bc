// A real coordinator against clients that mean harm (issue 21): every call
// is answered within a deadline, and what a peer sends is bounded before it
// is trusted. Each test is one attack found by an outside run, reproduced
// before its fix.

#include <cstdio>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cohort/v1/checkpoints.grpc.pb.h"
#include "cohort/v1/jobs.grpc.pb.h"
#include "cohort/v1/kv.grpc.pb.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "common/message_limits.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "tests/testing/testing.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;

// The resident set of process `pid` in MiB (/proc/PID/status VmRSS).
int RssMiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoi(line.substr(6)) / 1024;
  }
  return -1;
}

class HostileClientTest : public ::testing::Test {
 protected:
  // A running one-worker job (generation 1) that takes checkpoints.
  void StartJob(const std::string& trainer = "idle", const std::vector<std::string>& flags = {}) {
    cluster_.StartCoordinator("10s", flags);
    ASSERT_NE(cluster_.StartWorker("w0", "host", 0, trainer), nullptr);
    cluster_.WaitForIdleWorkers(1);
    v1::JobSpec spec = LocalCluster::Spec(1, 1, 1);
    spec.set_name("hostile");
    spec.mutable_checkpoint()->set_interval_steps(1);
    absl::StatusOr<v1::Job> job = cluster_.Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->job_id();
    cluster_.WaitForJob(job_id_, [](const v1::Job& j) { return LocalCluster::RunningAndReady(j, 1); },
                        absl::Seconds(30), "the job to run");
  }

  // A header any writer of a 1x1x1 layout could send.
  v1::UploadHeader Header(int64_t step) const {
    v1::UploadHeader header;
    header.set_job_id(job_id_);
    header.set_generation(1);
    header.set_step(step);
    header.set_writers(1);
    header.set_writer(0);
    header.mutable_layout()->set_data_parallel(1);
    header.mutable_layout()->set_tensor_parallel(1);
    header.mutable_layout()->set_pipeline_parallel(1);
    v1::TensorInfo* tensor = header.add_tensors();
    tensor->set_name("param/x");
    tensor->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
    tensor->add_global_shape(4);
    return header;
  }

  v1::Job Get() {
    absl::StatusOr<v1::Job> job = cluster_.GetJob(job_id_);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  LocalCluster cluster_{"hostile"};
  std::string job_id_;
};

// Found 1: a chunk of 2^63 bytes or more passed the size check as a
// negative number, the allocation threw inside the reactor, and the call
// never finished; 64 of them (the upload limit) turned checkpoints off.
TEST_F(HostileClientTest, AnUploadChunkOfTwoToTheSixtyThreeBytesIsRefusedAndFreesItsSlot) {
  StartJob();
  const int rss_before = RssMiB(cluster_.coordinator()->pid());
  auto stub = v1::Checkpoints::NewStub(cluster_.channel());
  const int attempts = 70;  // more than --max_checkpoint_uploads (64)
  for (int i = 0; i < attempts; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::UploadResponse response;
    auto writer = stub->Upload(&context, &response);
    v1::UploadRequest header;
    *header.mutable_header() = Header(100 + i);
    ASSERT_TRUE(writer->Write(header));
    v1::UploadRequest chunk;
    chunk.mutable_chunk()->set_tensor("param/x");
    chunk.mutable_chunk()->set_bytes(i % 2 == 0 ? (uint64_t{1} << 63) : ~uint64_t{0});
    writer->Write(chunk);  // may fail once the server has answered
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    ASSERT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << "upload " << i << " was never answered";
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("chunk.bytes")) << "upload " << i;
    if (i == 0) std::printf("  answer: %d %s\n", status.error_code(), status.error_message().c_str());
  }
  EXPECT_THAT(cluster_.coordinator()->ReadLog(), ::testing::Not(HasSubstr("uploads are in progress")));
  std::printf("  coordinator RSS %d MiB before, %d MiB after %d such uploads\n", rss_before,
              RssMiB(cluster_.coordinator()->pid()), attempts);
}

// Found 4 and 5: worker ids of megabytes (kept 10 minutes as lost-worker
// records, logged, listed) and job specs with megabyte strings (kept
// forever, returned by every Jobs.List). Both are refused before anything
// is stored, and memory stays where it was. Since the receive limit is
// 264 KiB (issue 43) the fields here are 256 KiB: a megabyte no longer
// passes the transport.
TEST_F(HostileClientTest, HugeHelloFieldsAndSpecStringsAreRefusedAndNothingIsKept) {
  cluster_.StartCoordinator();
  const pid_t pid = cluster_.coordinator()->pid();
  const int rss_before = RssMiB(pid);
  auto workers = v1::Workers::NewStub(cluster_.channel());
  constexpr int kHellos = 50;
  for (int i = 0; i < kHellos; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = workers->Attach(&context);
    v1::WorkerMessage hello;
    hello.set_incarnation(1000 + i);
    hello.mutable_hello()->set_worker_id(absl::StrCat("w", i, "\n", std::string(256 << 10, 'x')));
    hello.mutable_hello()->set_device_kind(v1::DEVICE_KIND_CPU);
    hello.mutable_hello()->set_incarnation(1000 + i);
    stream->Write(hello);
    stream->WritesDone();
    v1::CoordinatorMessage reply;
    while (stream->Read(&reply)) {
    }
    const grpc::Status status = stream->Finish();
    ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    ASSERT_THAT(status.error_message(), HasSubstr("hello.worker_id: "));
    ASSERT_THAT(status.error_message(), HasSubstr("bytes, at most 128 allowed"));
  }
  auto jobs = v1::Jobs::NewStub(cluster_.channel());
  constexpr int kSpecs = 17;
  for (int i = 0; i < kSpecs; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = LocalCluster::Spec(1, 1, 1);
    request.mutable_spec()->mutable_data()->mutable_shards()->set_pattern(
        std::string(256 << 10, 'p'));
    v1::Job job;
    const grpc::Status status = jobs->Submit(&context, request, &job);
    ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    ASSERT_LT(status.error_message().size(), 1000u) << "the pattern is echoed back";
  }
  absl::StatusOr<std::vector<v1::WorkerInfo>> listed = cluster_.ListWorkers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  const int rss_after = RssMiB(pid);
  std::printf(
      "  coordinator RSS %d MiB before, %d MiB after %d Hellos with 256 KiB worker ids and "
      "%d specs with 256 KiB patterns\n",
      rss_before, rss_after, kHellos, kSpecs);
  // Messages pass through gRPC's buffers one at a time; nothing is kept.
  if (!ProgramsAreSanitized()) {
    EXPECT_LT(rss_after - rss_before, 64);
  }
  EXPECT_THAT(cluster_.coordinator()->ReadLog(), ::testing::Not(HasSubstr("xxxxxxxxxxxxxxxx")));
}

// An abandoned KeyValue.WaitFor held its stream slot (and its waiter) until
// its timeout, up to a minute; now the caller's cancel frees both at once.
TEST_F(HostileClientTest, ACancelledWaitForFreesItsStreamSlotAtOnce) {
  // The worker's own Attach stream takes one of the three slots of 127.0.0.1.
  StartJob("idle", {"--max_streams_per_client=3"});
  auto kv = v1::KeyValue::NewStub(cluster_.channel());
  v1::WaitForRequest request;
  request.mutable_scope()->set_job_id(job_id_);
  request.mutable_scope()->set_generation(1);
  request.set_key("never-set");
  request.set_timeout_ms(60'000);
  struct Wait {
    grpc::ClientContext context;
    v1::GetResponse response;
    absl::Notification done;
    grpc::Status status;
  };
  auto start_wait = [&] {
    auto wait = std::make_unique<Wait>();
    Wait* w = wait.get();
    kv->async()->WaitFor(&w->context, &request, &w->response, [w](grpc::Status status) {
      w->status = status;
      w->done.Notify();
    });
    return wait;
  };
  std::vector<std::unique_ptr<Wait>> waits;
  for (int i = 0; i < 2; ++i) waits.push_back(start_wait());
  // A third is refused while those two wait. A probe can reach the
  // coordinator before one of the two and take its slot: that one, refused,
  // is started again.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    v1::GetResponse response;
    const grpc::Status third = kv->WaitFor(&context, request, &response);
    bool both_waiting = true;
    for (auto& wait : waits) {
      if (!wait->done.HasBeenNotified()) continue;
      ASSERT_EQ(wait->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << wait->status.error_message();
      wait = start_wait();
      both_waiting = false;
    }
    if (both_waiting && third.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    ASSERT_LT(absl::Now(), give_up) << "a third WaitFor was never refused: " << third.error_message();
  }
  for (auto& wait : waits) wait->context.TryCancel();
  for (auto& wait : waits) {
    ASSERT_TRUE(wait->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(wait->status.error_code(), grpc::StatusCode::CANCELLED);
  }
  // The slots are free well before the minute the waits asked for.
  const absl::Time freed_by = absl::Now() + absl::Seconds(10);
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    v1::GetResponse response;
    const grpc::Status again = kv->WaitFor(&context, request, &response);
    if (again.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) break;  // admitted, waited
    ASSERT_EQ(again.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << again.error_message();
    ASSERT_LT(absl::Now(), freed_by) << "the cancelled waits kept their stream slots";
  }
}

// "An unparseable first Attach message is not a clean OK": the stream ends
// INVALID_ARGUMENT saying why (raw HTTP/2: a gRPC client cannot send bytes
// that do not parse).
TEST_F(HostileClientTest, ARequestThatDoesNotParseIsInvalidArgumentWithAMessage) {
  cluster_.StartCoordinator();
  // gRPC's own answer to a unary or server-streaming request that does not
  // parse is an empty UNIMPLEMENTED; the streaming reactors parse their own.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/cohort.v1.Workers/Attach", "does not parse, before its Hello"},
      {"/cohort.v1.Checkpoints/Upload", "an UploadRequest that does not parse"},
      {"/cohort.v1.Checkpoints/Download", "a DownloadRequest that does not parse"},
      {"/cohort.v1.Jobs/Submit", "does not parse as a cohort.v1.SubmitJobRequest"},
      {"/cohort.v1.Jobs/Watch", "does not parse as a cohort.v1.WatchJobRequest"},
      {"/cohort.v1.KeyValue/WaitFor", "does not parse as a cohort.v1.WaitForRequest"},
      {"/cohort.v1.Workers/Drain", "does not parse as a cohort.v1.DrainWorkerRequest"},
  };
  for (const auto& [path, message] : cases) {
    absl::StatusOr<CommandResult> call = RunCommand(
        "/usr/bin/python3",
        {absl::StrCat(COHORT_SOURCE_DIR, "/tools/bench/hostile_memory.py"),
         "--target=" + cluster_.address(), absl::StrCat("--pid=", cluster_.coordinator()->pid()),
         "--path=" + path, "--payload_hex=ffffffff"},
        absl::Seconds(60));
    ASSERT_TRUE(call.ok()) << call.status();
    ASSERT_EQ(call->exit_code, 0) << call->output;
    EXPECT_THAT(call->output, HasSubstr("grpc-status 3 ")) << path;
    EXPECT_THAT(call->output, HasSubstr(message)) << path;
  }
}

// Found 2: 100 Jobs.Submit streams, each sending all but the last byte of a
// 4 MiB message, took a coordinator from 45 to 457 MB before any credential
// could be checked. gRPC's memory has a quota (--grpc_memory_bytes), and
// since issue 43 the receive limit (264 KiB) fits the largest message
// Cohort's own peers send, so that each such stream holds a quarter of a
// MiB. Here 200 streams announce messages of that limit.
TEST_F(HostileClientTest, PartialMessagesOfUnauthenticatedPeersStayWithinTheGrpcQuota) {
  cluster_.StartCoordinator();
  absl::StatusOr<CommandResult> attack =
      RunCommand("/usr/bin/python3",
                 {absl::StrCat(COHORT_SOURCE_DIR, "/tools/bench/hostile_memory.py"),
                  "--target=" + cluster_.address(),
                  absl::StrCat("--pid=", cluster_.coordinator()->pid()), "--connections=2",
                  "--streams=100", "--hold=1", absl::StrCat("--bytes=", kDefaultMaxMessageBytes)},
                 absl::Seconds(120));
  ASSERT_TRUE(attack.ok()) << attack.status();
  ASSERT_EQ(attack->exit_code, 0) << attack->output;
  std::printf("  %s", attack->output.c_str());
  const std::regex rss(R"(RSS (\d+) MiB before, (\d+) MiB peak)");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(attack->output, match, rss)) << attack->output;
  const int before = std::stoi(match[1]), peak = std::stoi(match[2]);
  // The quota plus gRPC's bookkeeping plus what the allocator keeps of
  // freed buffers, which varies with timing: 35 to 45 MiB above the fresh
  // RSS on the development VM; the old defaults (a 512 MiB quota, 4 MiB
  // messages) let the same attack take 330 MiB.
  if (!ProgramsAreSanitized()) {
    EXPECT_LT(peak - before, 128) << attack->output;
  }
  // The coordinator still serves.
  EXPECT_TRUE(cluster_.ListWorkers().ok());
}

// Found 6: flags that wrapped, were ignored or let a second coordinator
// share a port. Each is refused at start-up (exit 64, or 1 for the port)
// with a message naming it.
TEST_F(HostileClientTest, BadFlagsAndABusyPortStopTheCoordinatorAtStartUp) {
  cluster_.StartCoordinator();
  const std::string data = absl::StrCat("--data_dir=", cluster_.dir(), "/other");
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--listen=127.0.0.1:0", "--heartbeat_timeout=4294967396ms"}, 64, "--heartbeat_timeout="},
      {{"--listen=127.0.0.1:0", "--heartbeat_timeout=inf"}, 64, "--heartbeat_timeout="},
      {{"--listen=127.0.0.1:0", "--readopt_grace=-5s"}, 64, "--readopt_grace=-5s"},
      {{"--listen=127.0.0.1:0", "--checkpoint_abandon_after=0"}, 64, "--checkpoint_abandon_after="},
      {{"--listen=127.0.0.1:99999"}, 64, "--listen=127.0.0.1:99999: the port must be"},
      // Cohort's own workers send 256 KiB checkpoint pieces.
      {{"--listen=127.0.0.1:0", "--max_message_bytes=262144"}, 64, "--max_message_bytes >= 270336"},
      {{"--listen=127.0.0.1:0", "--max_kv_value_bytes=270000"},
       64,
       "--max_kv_value_bytes (270000) plus 8192 bytes for the rest of a KeyValue.Set must fit in "
       "--max_message_bytes (270336)"},
      {{"--listen=" + cluster_.address()}, 1, "is the port in use"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back(data);
    args.push_back("--metrics_address=127.0.0.1:0");
    absl::StatusOr<CommandResult> run =
        RunCommand(BinaryPath("cohort-coordinator"), args, absl::Seconds(30));
    ASSERT_TRUE(run.ok()) << run.status() << " (still serving?) for " << args[0] << " " << args[1];
    EXPECT_EQ(run->exit_code, c.exit_code) << run->output;
    EXPECT_THAT(run->output, HasSubstr(c.message));
  }
  // The first coordinator still serves.
  EXPECT_TRUE(cluster_.ListWorkers().ok());
  // The worker refuses what the coordinator would refuse in its Hello.
  const std::vector<std::pair<std::string, std::string>> worker_cases = {
      {"--worker_id=w0\nforged", "--worker_id: <"},
      {"--worker_id=" + std::string(200, 'w'), "--worker_id: 200 bytes, at most 128"},
      {"--host=a b", "--host: \"a b\" has a character outside"},
      {"--metrics_address=127.0.0.1:99999", "--metrics_address=127.0.0.1:99999: the port"},
      {"--device_index=-1", "--device_index must be within [0, 4095]"},
  };
  for (const auto& [flag, message] : worker_cases) {
    absl::StatusOr<CommandResult> run = RunCommand(
        BinaryPath("cohort-worker"), {"--coordinator=" + cluster_.address(), flag},
        absl::Seconds(30));
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 1) << run->output;
    EXPECT_THAT(run->output, HasSubstr(message)) << flag;
  }
  EXPECT_TRUE(cluster_.ListWorkers()->empty()) << "a worker with a bad flag attached";
  absl::StatusOr<CommandResult> help =
      RunCommand(BinaryPath("cohort-coordinator"), {"--help"}, absl::Seconds(30));
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_EQ(help->exit_code, 0) << help->output;
  EXPECT_THAT(help->output, HasSubstr("--heartbeat_timeout"));
}

// Found 3: Watch streams that never read held a copy of the whole job per
// event, without bound. Now progress events coalesce, later events carry no
// spec, and a watcher that falls far behind is dropped (JobsService).
TEST_F(HostileClientTest, WatchEventsAfterTheSnapshotCarryNoSpec) {
  StartJob("engine");
  auto stub = v1::Jobs::NewStub(cluster_.channel());
  v1::WatchJobRequest request;
  request.set_job_id(job_id_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Watch(&context, request);
  v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.kind(), v1::JOB_EVENT_KIND_SNAPSHOT);
  EXPECT_TRUE(event.job().spec().has_model()) << "the snapshot carries the whole spec";
  bool later = false;
  while (!later && reader->Read(&event)) {
    if (event.kind() == v1::JOB_EVENT_KIND_SNAPSHOT) continue;
    later = true;
    EXPECT_FALSE(event.job().spec().has_model()) << v1::JobEventKind_Name(event.kind());
    EXPECT_EQ(event.job().spec().steps(), Get().spec().steps());
    EXPECT_EQ(event.job().spec().name(), "hostile");
  }
  EXPECT_TRUE(later) << "no event after the snapshot";
  context.TryCancel();
  reader->Finish();
}

}  // namespace
}  // namespace cohort::testing
