// The coordinator's Attach streams on completion queues of its own
// (coordinator/service/attach_streams.h), against a real coordinator: many
// streams spread over a few queues are each welcomed and answered in order,
// a refusal still ends its stream with the reason, and a coordinator stopped
// with streams open ends every one of them and exits cleanly (its queues
// close only after gRPC's shutdown, or the process would abort). A worker
// that sends and never reads makes the coordinator stop reading it, not
// queue an ack per message. Workers that cancel their streams while the
// coordinator is writing to them leave it running (issue 43: a write that
// completed after the stream's end popped an outbox the end had emptied).

#include <csignal>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/testing.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kQueues = 3;
constexpr int kStreams = 40;  // more than kQueues x the requests each keeps waiting

struct RawWorker {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream;
};

v1::WorkerMessage Hello(const std::string& id, uint64_t incarnation) {
  v1::WorkerMessage message;
  message.set_incarnation(incarnation);
  v1::Hello* hello = message.mutable_hello();
  hello->set_worker_id(id);
  hello->set_host("attach-host");
  hello->set_device_kind(v1::DEVICE_KIND_CPU);
  hello->set_incarnation(incarnation);
  hello->mutable_capabilities()->set_cpu_cores(1);
  hello->mutable_capabilities()->set_memory_bytes(int64_t{1} << 30);
  return message;
}

v1::WorkerMessage Heartbeat(uint64_t incarnation, uint64_t sequence) {
  v1::WorkerMessage message;
  message.set_incarnation(incarnation);
  message.mutable_heartbeat()->set_sequence(sequence);
  return message;
}

class AttachStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A long heartbeat timeout: the back-pressure test keeps a worker unread.
    cluster_.StartCoordinator(
        "10s", {absl::StrCat("--attach_queues=", kQueues), "--heartbeat_timeout=60s"});
    workers_ = v1::Workers::NewStub(cluster_.channel());
  }

  // Opens a stream, says Hello and reads the Welcome.
  std::unique_ptr<RawWorker> Attach(const std::string& id, uint64_t incarnation,
                                    v1::Workers::Stub* stub = nullptr) {
    auto worker = std::make_unique<RawWorker>();
    worker->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    worker->stream = (stub != nullptr ? stub : workers_.get())->Attach(&worker->context);
    EXPECT_TRUE(worker->stream->Write(Hello(id, incarnation)));
    v1::CoordinatorMessage welcome;
    EXPECT_TRUE(worker->stream->Read(&welcome)) << id << " got no Welcome";
    EXPECT_EQ(welcome.kind_case(), v1::CoordinatorMessage::kWelcome) << id;
    return worker;
  }

  LocalCluster cluster_{"attach"};
  std::unique_ptr<v1::Workers::Stub> workers_;
};

TEST_F(AttachStreamsTest, ManyStreamsOverFewQueuesAreAnsweredInOrderAndEndWithTheCoordinator) {
  std::vector<std::unique_ptr<RawWorker>> workers;
  for (int i = 0; i < kStreams; ++i) workers.push_back(Attach(absl::StrCat("attach-", i), i + 1));
  ASSERT_FALSE(HasFailure());
  cluster_.WaitForIdleWorkers(kStreams);

  // Three heartbeats on every stream before any is read: each stream's acks
  // come back in its own order.
  for (int round = 1; round <= 3; ++round) {
    for (int i = 0; i < kStreams; ++i) {
      ASSERT_TRUE(workers[i]->stream->Write(Heartbeat(i + 1, round))) << "stream " << i;
    }
  }
  for (int i = 0; i < kStreams; ++i) {
    for (int round = 1; round <= 3; ++round) {
      v1::CoordinatorMessage ack;
      ASSERT_TRUE(workers[i]->stream->Read(&ack)) << "stream " << i << " heartbeat " << round;
      ASSERT_EQ(ack.kind_case(), v1::CoordinatorMessage::kHeartbeatAck) << "stream " << i;
      EXPECT_EQ(ack.heartbeat_ack().sequence(), static_cast<uint64_t>(round)) << "stream " << i;
    }
  }

  // A second Hello on an attached stream is refused: the stream ends with
  // the reason, and its worker is gone while the others stay.
  ASSERT_TRUE(workers[0]->stream->Write(Hello("attach-0", 1)));
  v1::CoordinatorMessage message;
  while (workers[0]->stream->Read(&message)) {
  }
  grpc::Status refused = workers[0]->stream->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("Hello may only be the first message"));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (cluster_.CountWorkers(v1::WORKER_STATE_IDLE) != kStreams - 1) {
    ASSERT_LT(absl::Now(), deadline) << "the refused stream's worker is still listed idle";
    absl::SleepFor(absl::Milliseconds(20));
  }

  // SIGTERM with 39 streams open: every one ends, and the coordinator exits
  // cleanly (a queue shut down under a live stream would abort it).
  cluster_.coordinator()->Signal(SIGTERM);
  for (int i = 1; i < kStreams; ++i) {
    while (workers[i]->stream->Read(&message)) {
    }
    grpc::Status status = workers[i]->stream->Finish();
    EXPECT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << "stream " << i << " did not end with the coordinator";
  }
  absl::StatusOr<int> exit_code = cluster_.coordinator()->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0) << cluster_.coordinator()->ReadLog();
}

// A worker on a connection of its own: gRPC shares a connection between
// channels with the same arguments unless told not to, and one cancelled
// connection per worker is what a flapping host looks like.
std::unique_ptr<v1::Workers::Stub> OwnConnection(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::Workers::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

// Each round, workers attach, queue acks on their streams (heartbeats they
// do not read, but one: the coordinator is then writing to them) and cancel
// all at once. The old stream code died with SIGSEGV when a write completed
// after the call's end: the end had emptied the outbox, and the write's
// completion popped the empty deque, destroying a message twice.
TEST_F(AttachStreamsTest, WorkersThatCancelWhileTheCoordinatorWritesToThemLeaveItRunning) {
  constexpr int kRounds = 30;
  constexpr int kWorkers = 8;
  constexpr int kHeartbeats = 48;  // under the outbox bound: reading goes on
  uint64_t incarnation = 100;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::unique_ptr<v1::Workers::Stub>> stubs;
    std::vector<std::unique_ptr<RawWorker>> workers;
    for (int i = 0; i < kWorkers; ++i) {
      stubs.push_back(OwnConnection(cluster_.address()));
      workers.push_back(Attach(absl::StrCat("flap-", i), ++incarnation, stubs.back().get()));
    }
    ASSERT_FALSE(HasFailure()) << "round " << round << "; coordinator log:\n"
                               << cluster_.coordinator()->ReadLog();
    for (int i = 0; i < kWorkers; ++i) {
      const uint64_t own = incarnation - kWorkers + 1 + i;
      for (int h = 1; h <= kHeartbeats; ++h) {
        // A write fails only once the coordinator is gone; the check below says why.
        if (!workers[i]->stream->Write(Heartbeat(own, h))) break;
      }
    }
    for (int i = 0; i < kWorkers; ++i) {
      v1::CoordinatorMessage ack;
      workers[i]->stream->Read(&ack);
    }
    for (const std::unique_ptr<RawWorker>& worker : workers) worker->context.TryCancel();
    for (const std::unique_ptr<RawWorker>& worker : workers) worker->stream->Finish();
    // The coordinator has handled every stream's end once no worker is
    // listed; a crash while doing so ends the wait too.
    Subprocess& coordinator = *cluster_.coordinator();
    WaitUntil(
        [&] { return !coordinator.Running() || cluster_.CountWorkers(v1::WORKER_STATE_IDLE) == 0; },
        absl::Seconds(30));
    if (!coordinator.Running()) {
      absl::StatusOr<int> code = coordinator.Wait(absl::ZeroDuration());
      FAIL() << "the coordinator ended in round " << round << " ("
             << (code.ok() ? absl::StrCat("exit status ", *code,
                                          *code > 128 ? absl::StrCat(", signal ", *code - 128) : "")
                           : code.status().ToString())
             << "); its log:\n"
             << coordinator.ReadLog();
    }
    ASSERT_EQ(cluster_.CountWorkers(v1::WORKER_STATE_IDLE), 0) << "round " << round;
  }
  // The coordinator still serves.
  std::unique_ptr<RawWorker> after = Attach("after", ++incarnation);
  EXPECT_FALSE(HasFailure());
  EXPECT_TRUE(cluster_.coordinator()->Running()) << cluster_.coordinator()->ReadLog();
  after->context.TryCancel();
  after->stream->Finish();
}

// The coordinator's cohort_heartbeats_received_total.
absl::StatusOr<int64_t> HeartbeatsReceived(const std::string& metrics_address) {
  absl::StatusOr<std::string> body = HttpGet(metrics_address, "/metrics", absl::Seconds(5));
  if (!body.ok()) return body.status();
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (!absl::ConsumePrefix(&line, "cohort_heartbeats_received_total ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line, &value)) return static_cast<int64_t>(value);
  }
  return absl::NotFoundError("no cohort_heartbeats_received_total in /metrics");
}

TEST_F(AttachStreamsTest, AWorkerThatNeverReadsIsNoLongerReadNotQueuedAnAckPerMessage) {
  absl::StatusOr<std::string> line =
      WaitForLogLine(*cluster_.coordinator(), "/metrics, data in", absl::Seconds(10));
  ASSERT_TRUE(line.ok()) << line.status();
  const size_t at = line->find("http://");
  ASSERT_NE(at, std::string::npos) << *line;
  const std::string metrics = line->substr(at + 7, line->find("/metrics") - at - 7);

  // Without BDP probing the client's receive window stays 64 KiB, so the
  // coordinator's acks stop being written after a few thousand.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto channel =
      grpc::CreateCustomChannel(cluster_.address(), grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Workers::NewStub(channel);
  std::unique_ptr<RawWorker> worker = Attach("mute", 7, stub.get());
  ASSERT_FALSE(HasFailure());
  absl::StatusOr<int64_t> before = HeartbeatsReceived(metrics);
  ASSERT_TRUE(before.ok()) << before.status();

  constexpr int kSent = 50'000;
  for (int i = 1; i <= kSent; ++i) ASSERT_TRUE(worker->stream->Write(Heartbeat(7, i))) << i;
  // Wait (bounded) until the coordinator's count stops moving: it stops
  // reading once kMaxOutbox acks wait, after the window's few thousand.
  int64_t handled = 0;
  int unchanged = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (unchanged < 10 && handled < kSent && absl::Now() < deadline) {
    absl::StatusOr<int64_t> now = HeartbeatsReceived(metrics);
    ASSERT_TRUE(now.ok()) << now.status();
    unchanged = *now - *before == handled ? unchanged + 1 : 0;
    handled = *now - *before;
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::printf("  heartbeats handled while the worker did not read: %lld of %d\n",
              static_cast<long long>(handled), kSent);
  EXPECT_LT(handled, kSent / 2) << "the coordinator kept reading a worker that never reads";

  // Reading resumes the stream: every heartbeat is acked, in order.
  uint64_t last = 0;
  v1::CoordinatorMessage message;
  while (last < kSent && worker->stream->Read(&message)) {
    if (message.kind_case() != v1::CoordinatorMessage::kHeartbeatAck) continue;
    ASSERT_EQ(message.heartbeat_ack().sequence(), last + 1);
    last = message.heartbeat_ack().sequence();
  }
  EXPECT_EQ(last, static_cast<uint64_t>(kSent));
  worker->context.TryCancel();
  worker->stream->Finish();
}

}  // namespace
}  // namespace cohort::testing
