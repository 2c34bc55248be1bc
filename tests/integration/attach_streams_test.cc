// The coordinator's Attach streams on completion queues of its own
// (coordinator/service/attach_streams.h), against a real coordinator: many
// streams spread over a few queues are each welcomed and answered in order,
// a refusal still ends its stream with the reason, and a coordinator stopped
// with streams open ends every one of them and exits cleanly (its queues
// close only after gRPC's shutdown, or the process would abort).

#include <csignal>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
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
    cluster_.StartCoordinator("10s", {absl::StrCat("--attach_queues=", kQueues)});
    workers_ = v1::Workers::NewStub(cluster_.channel());
  }

  // Opens a stream, says Hello and reads the Welcome.
  std::unique_ptr<RawWorker> Attach(const std::string& id, uint64_t incarnation) {
    auto worker = std::make_unique<RawWorker>();
    worker->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    worker->stream = workers_->Attach(&worker->context);
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

}  // namespace
}  // namespace cohort::testing
