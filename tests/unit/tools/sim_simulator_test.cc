// Simulator against an in-process fake Workers service on 127.0.0.1:0.
#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "gtest/gtest.h"
#include "tools/sim/simulator.h"

namespace cohort::sim {
namespace {

enum class Mode { kNormal, kRefuseHello, kNeverWelcome };

// Records what the simulated workers did; thread-safe.
struct ServerLog {
  absl::Mutex mu;
  std::set<std::string> peers;
  std::set<std::string> worker_ids;
  std::set<uint64_t> incarnations;
  std::vector<v1::Hello> hellos;
  std::vector<v1::AssignmentStatus> statuses;
  int heartbeats = 0;
  int half_closed = 0;
  int leaves = 0;
};

class FakeAttach : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  FakeAttach(Mode mode, ServerLog* log, std::string peer)
      : mode_(mode), log_(log), peer_(std::move(peer)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&log_->mu);
      ++log_->half_closed;
      Finish(grpc::Status::OK);
      return;
    }
    if (in_.has_hello()) {
      if (mode_ == Mode::kRefuseHello) {
        Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "refused by fake"));
        return;
      }
      {
        absl::MutexLock lock(&log_->mu);
        log_->peers.insert(peer_);
        log_->worker_ids.insert(in_.hello().worker_id());
        log_->incarnations.insert(in_.incarnation());
        log_->hellos.push_back(in_.hello());
      }
      if (mode_ == Mode::kNormal) {
        v1::CoordinatorMessage welcome;
        welcome.mutable_welcome()->set_heartbeat_interval_ms(1000);
        welcome.mutable_welcome()->set_heartbeat_timeout_ms(3000);
        Send(welcome);
        if (in_.hello().worker_id() == "sim-0") {
          v1::CoordinatorMessage assign;
          assign.mutable_assign()->set_job_id("job-a");
          assign.mutable_assign()->set_generation(3);
          Send(assign);
          v1::CoordinatorMessage stop;
          stop.mutable_stop()->set_job_id("job-a");
          stop.mutable_stop()->set_generation(3);
          Send(stop);
        }
      }
    } else if (in_.has_leave()) {
      absl::MutexLock lock(&log_->mu);
      ++log_->leaves;
    } else if (in_.has_heartbeat()) {
      {
        absl::MutexLock lock(&log_->mu);
        ++log_->heartbeats;
      }
      v1::CoordinatorMessage ack;
      ack.mutable_heartbeat_ack()->set_sequence(in_.heartbeat().sequence());
      Send(ack);
    } else if (in_.has_status()) {
      absl::MutexLock lock(&log_->mu);
      log_->statuses.push_back(in_.status());
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    outbox_.pop_front();
    if (ok && !outbox_.empty()) StartWrite(&outbox_.front());
  }

  void OnDone() override { delete this; }

 private:
  void Send(const v1::CoordinatorMessage& message) {
    absl::MutexLock lock(&mu_);
    outbox_.push_back(message);
    if (outbox_.size() == 1) StartWrite(&outbox_.front());
  }

  const Mode mode_;
  ServerLog* const log_;
  const std::string peer_;
  v1::WorkerMessage in_;
  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> outbox_ ABSL_GUARDED_BY(mu_);
};

class FakeWorkersService : public v1::Workers::CallbackService {
 public:
  FakeWorkersService(Mode mode, ServerLog* log) : mode_(mode), log_(log) {}
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Attach(
      grpc::CallbackServerContext* context) override {
    return new FakeAttach(mode_, log_, context->peer());
  }

 private:
  Mode mode_;
  ServerLog* log_;
};

class SimulatorTest : public ::testing::Test {
 protected:
  void StartServer(Mode mode) {
    service_ = std::make_unique<FakeWorkersService>(mode, &log_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  SimConfig Config(int workers) {
    SimConfig config;
    config.coordinator = absl::StrCat("127.0.0.1:", port_);
    config.workers = workers;
    config.rate = 20;
    config.warmup = absl::Milliseconds(100);
    config.duration = absl::Milliseconds(500);
    config.attach_batch = 16;
    config.attach_timeout = absl::Seconds(20);
    return config;
  }

  ServerLog log_;
  std::unique_ptr<FakeWorkersService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(SimulatorTest, AttachesHeartbeatsAnswersAssignmentsAndClosesCleanly) {
  StartServer(Mode::kNormal);
  SimConfig config = Config(40);
  config.channels = 4;
  config.workers_per_host = 8;
  absl::StatusOr<std::unique_ptr<Simulator>> sim = Simulator::Create(config);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ((*sim)->channel_count(), 4);
  absl::StatusOr<SimReport> report = (*sim)->Run();
  ASSERT_TRUE(report.ok()) << report.status();

  EXPECT_EQ(report->workers, 40);
  EXPECT_EQ(report->attached, 40);
  EXPECT_EQ(report->errors(), 0);
  // 40 workers * 20/s * 0.5 s = 400 in the window; allow for scheduling slack.
  EXPECT_GT(report->heartbeat.count, 200);
  EXPECT_LT(report->heartbeat.count, 600);
  EXPECT_GT(report->heartbeat.p50_ms, 0);
  EXPECT_GE(report->heartbeat.max_ms, report->heartbeat.p99_ms);
  EXPECT_NEAR(report->window_seconds, 0.5, 0.2);
  EXPECT_EQ(report->assignments, 2);

  absl::MutexLock lock(&log_.mu);
  EXPECT_EQ(log_.worker_ids.size(), 40u);
  EXPECT_EQ(log_.worker_ids.count("sim-39"), 1u);
  EXPECT_EQ(log_.incarnations.size(), 40u);
  EXPECT_EQ(log_.incarnations.count(0), 0u);
  // Four channels, four TCP connections.
  EXPECT_EQ(log_.peers.size(), 4u);
  for (const v1::Hello& hello : log_.hellos) {
    const int index = std::stoi(hello.worker_id().substr(4));
    EXPECT_EQ(hello.host(), absl::StrCat("sim-host-", index / 8));
    EXPECT_EQ(hello.device_index(), index % 8);
    EXPECT_EQ(hello.device_kind(), v1::DEVICE_KIND_CPU);
    EXPECT_NE(hello.incarnation(), 0u);
  }
  ASSERT_EQ(log_.statuses.size(), 2u);
  EXPECT_EQ(log_.statuses[0].job_id(), "job-a");
  EXPECT_EQ(log_.statuses[0].generation(), 3u);
  EXPECT_EQ(log_.statuses[0].state(), v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(log_.statuses[1].state(), v1::ASSIGNMENT_STATE_RELEASED);
  EXPECT_GE(log_.heartbeats, report->heartbeat.count);
  // Every stream was half-closed by the simulator (WritesDone).
  EXPECT_EQ(log_.half_closed, 40);
  // ...after saying it was leaving.
  EXPECT_EQ(log_.leaves, 40);
}

TEST_F(SimulatorTest, RefusedHelloFailsTheRun) {
  StartServer(Mode::kRefuseHello);
  absl::StatusOr<std::unique_ptr<Simulator>> sim = Simulator::Create(Config(8));
  ASSERT_TRUE(sim.ok()) << sim.status();
  absl::StatusOr<SimReport> report = (*sim)->Run();
  EXPECT_EQ(report.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(report.status().message().find("refused by fake"), std::string::npos)
      << report.status();
}

TEST_F(SimulatorTest, MissingWelcomeTimesOut) {
  StartServer(Mode::kNeverWelcome);
  SimConfig config = Config(8);
  config.attach_timeout = absl::Milliseconds(300);
  config.shutdown_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Simulator>> sim = Simulator::Create(config);
  ASSERT_TRUE(sim.ok()) << sim.status();
  absl::StatusOr<SimReport> report = (*sim)->Run();
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(report.status().message().find("0/8 workers attached"), std::string::npos)
      << report.status();
}

TEST(SimulatorConfigTest, RejectsBadConfig) {
  SimConfig config;
  EXPECT_EQ(Simulator::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.coordinator = "127.0.0.1:1";
  config.rate = 0;
  EXPECT_EQ(Simulator::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.rate = 1;
  config.workers = 0;
  EXPECT_EQ(Simulator::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.workers = 1001;
  absl::StatusOr<std::unique_ptr<Simulator>> sim = Simulator::Create(config);
  ASSERT_TRUE(sim.ok());
  EXPECT_EQ((*sim)->channel_count(), 5);  // auto: one per 250 workers
}

}  // namespace
}  // namespace cohort::sim
