// WorkerAgent against an in-process fake coordinator on 127.0.0.1: the
// Attach protocol, commands, generations, reconnects and clean exits.

#include "worker/agent/agent.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/testing/net.h"
#include "tests/testing/wait.h"
#include "worker/agent/idle_trainer.h"

namespace cohort::worker {
namespace {

using v1::CoordinatorMessage;
using v1::WorkerMessage;

// Every wait in this file is bounded by this; the conditions normally hold
// within milliseconds.
constexpr absl::Duration kWait = absl::Seconds(10);
constexpr uint64_t kIncarnation = 0x1234'5678'9abc'def0;

// What the fake has seen, copied for predicates.
struct Seen {
  struct Message {
    int connection;  // 0-based index of the accepted stream
    absl::Time at;
    WorkerMessage message;
  };
  std::vector<Message> messages;
  int connections = 0;
  int refused = 0;
  std::vector<bool> ended;      // per connection: the handler's read loop ended
  std::vector<bool> cancelled;  // per connection: ended by cancellation

  std::vector<v1::AssignmentStatus> Statuses() const {
    std::vector<v1::AssignmentStatus> out;
    for (const auto& m : messages) {
      if (m.message.has_status()) out.push_back(m.message.status());
    }
    return out;
  }
  std::vector<Message> Of(WorkerMessage::KindCase kind, int connection = -1) const {
    std::vector<Message> out;
    for (const auto& m : messages) {
      if (m.message.kind_case() == kind && (connection < 0 || m.connection == connection)) {
        out.push_back(m);
      }
    }
    return out;
  }
};

// A clock that stands still until started, then moves a second at every
// reading: time passes for the agent only as fast as it looks.
class SteppingClock : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    if (stepping_) now_ += absl::Seconds(1);
    return now_;
  }
  void StartStepping() {
    absl::MutexLock lock(&mu_);
    stepping_ = true;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'700'000'000);
  bool stepping_ ABSL_GUARDED_BY(mu_) = false;
};

// The coordinator side of Attach, driven by the test. Answers each Hello with
// a Welcome and each heartbeat with an ack unless told otherwise.
class FakeCoordinator final : public v1::Workers::Service {
 public:
  struct Options {
    uint32_t heartbeat_interval_ms = 20;
    uint32_t heartbeat_timeout_ms = 0;  // 0: the agent checks no ack timeout
    bool ack_heartbeats = true;
    int refuse_attaches = 0;  // answer the first N Attach calls with ALREADY_EXISTS
  };
  explicit FakeCoordinator(Options options) : options_(options) {}

  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<CoordinatorMessage, WorkerMessage>* stream) override {
    auto connection = std::make_shared<Connection>();
    connection->context = context;
    connection->stream = stream;
    {
      absl::MutexLock lock(&mu_);
      if (options_.refuse_attaches > 0) {
        --options_.refuse_attaches;
        ++seen_.refused;
        cv_.SignalAll();
        return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "worker is already attached");
      }
      connection->index = seen_.connections++;
      seen_.ended.push_back(false);
      seen_.cancelled.push_back(false);
      current_ = connection;
    }
    WorkerMessage message;
    while (stream->Read(&message)) {
      {
        absl::MutexLock lock(&mu_);
        seen_.messages.push_back({connection->index, absl::Now(), message});
        cv_.SignalAll();
      }
      CoordinatorMessage reply;
      if (message.has_hello()) {
        v1::Welcome* welcome = reply.mutable_welcome();
        welcome->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
        welcome->set_heartbeat_timeout_ms(options_.heartbeat_timeout_ms);
        welcome->set_coordinator_id("fake");
        Write(*connection, reply);
      } else if (message.has_heartbeat() && options_.ack_heartbeats) {
        reply.mutable_heartbeat_ack()->set_sequence(message.heartbeat().sequence());
        Write(*connection, reply);
      }
    }
    {
      absl::MutexLock lock(&connection->write_mu);
      connection->done = true;
    }
    absl::MutexLock lock(&mu_);
    seen_.ended[connection->index] = true;
    seen_.cancelled[connection->index] = context->IsCancelled();
    if (current_ == connection) current_.reset();
    cv_.SignalAll();
    return grpc::Status::OK;
  }

  // Sends to the newest open stream; false if there is none.
  bool Send(const CoordinatorMessage& message) {
    std::shared_ptr<Connection> connection;
    {
      absl::MutexLock lock(&mu_);
      connection = current_;
    }
    return connection != nullptr && Write(*connection, message);
  }

  // Cancels the newest open stream, as a crashed coordinator would break it.
  void BreakStream() {
    absl::MutexLock lock(&mu_);
    // The context stays valid until the handler marks the stream ended under mu_.
    if (current_ != nullptr) current_->context->TryCancel();
  }

  // Waits (bounded by kWait) until `predicate` holds for what was seen.
  bool WaitFor(const std::function<bool(const Seen&)>& predicate) {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + kWait;
    while (!predicate(seen_)) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return predicate(seen_);
    }
    return true;
  }

  Seen seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  struct Connection {
    int index = 0;
    grpc::ServerContext* context = nullptr;
    grpc::ServerReaderWriter<CoordinatorMessage, WorkerMessage>* stream = nullptr;
    absl::Mutex write_mu;
    bool done ABSL_GUARDED_BY(write_mu) = false;  // the handler is returning
  };

  static bool Write(Connection& connection, const CoordinatorMessage& message) {
    absl::MutexLock lock(&connection.write_mu);
    return !connection.done && connection.stream->Write(message);
  }

  absl::Mutex mu_;
  absl::CondVar cv_;
  Options options_ ABSL_GUARDED_BY(mu_);
  Seen seen_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Connection> current_ ABSL_GUARDED_BY(mu_);
};

// A trainer whose Prepare fails.
class FailingTrainer : public Trainer {
 public:
  absl::Status Prepare(const Assignment&) override {
    return absl::ResourceExhaustedError("model does not fit in 1 MiB");
  }
  std::vector<v1::HeldState> Suspend() override { return {}; }
  void Interrupt(const JobId&, Generation) override {}
  absl::Status Donate(const Assignment&) override { return absl::OkStatus(); }
  void Stop() override {}
  TrainingProgress progress() const override { return {}; }
};

// A trainer whose Prepare waits until the test releases it (or Stop).
class GatedTrainer : public IdleTrainer {
 public:
  absl::Status Prepare(const Assignment& assignment) override {
    {
      absl::MutexLock lock(&mu_);
      preparing_ = true;
      mu_.Await(absl::Condition(&released_));
    }
    return IdleTrainer::Prepare(assignment);
  }
  void Stop() override {
    Release();
    IdleTrainer::Stop();
  }
  bool WaitUntilPreparing() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&preparing_), kWait);
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  absl::Mutex mu_;
  bool preparing_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// A trainer that records the WarmUps it is given and reports the last as
// prepared.
class WarmingTrainer : public IdleTrainer {
 public:
  void Warm(const Assignment& slot) override {
    absl::MutexLock lock(&mu_);
    warmed_.push_back(slot.job_id.value());
  }
  v1::WarmSpare warm_status() const override {
    absl::MutexLock lock(&mu_);
    v1::WarmSpare warm;
    if (!warmed_.empty() && !warmed_.back().empty()) {
      warm.set_job_id(warmed_.back());
      warm.set_state(v1::WARM_SPARE_STATE_WARM);
      warm.set_bytes(4096);
    }
    return warm;
  }
  std::vector<std::string> warmed() const {
    absl::MutexLock lock(&mu_);
    return warmed_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> warmed_ ABSL_GUARDED_BY(mu_);  // job ids; "" = release
};

CoordinatorMessage WarmUpMessage(const std::string& job, uint64_t sequence) {
  CoordinatorMessage message;
  v1::WarmUp* warm = message.mutable_warm_up();
  warm->set_sequence(sequence);
  warm->set_job_id(job);
  warm->set_generation(1);
  warm->mutable_coordinates()->set_rank(1);
  return message;
}

CoordinatorMessage AssignMessage(const std::string& job, uint64_t generation, int rank) {
  CoordinatorMessage message;
  v1::Assign* assign = message.mutable_assign();
  assign->set_job_id(job);
  assign->set_generation(generation);
  assign->mutable_spec()->set_name(job);
  assign->mutable_mesh()->set_data_parallel(2);
  assign->mutable_mesh()->set_tensor_parallel(1);
  assign->mutable_mesh()->set_pipeline_parallel(1);
  assign->mutable_coordinates()->set_data(rank);
  assign->mutable_coordinates()->set_rank(rank);
  return message;
}

CoordinatorMessage ReconfigureMessage(const std::string& job, uint64_t generation, int rank) {
  CoordinatorMessage message;
  v1::Reconfigure* reconfigure = message.mutable_reconfigure();
  reconfigure->set_job_id(job);
  reconfigure->set_generation(generation);
  reconfigure->mutable_mesh()->set_data_parallel(3);
  reconfigure->mutable_coordinates()->set_data(rank);
  reconfigure->mutable_coordinates()->set_rank(rank);
  reconfigure->set_reason("worker joined");
  return message;
}

CoordinatorMessage StopMessage(const std::string& job, uint64_t generation) {
  CoordinatorMessage message;
  message.mutable_stop()->set_job_id(job);
  message.mutable_stop()->set_generation(generation);
  message.mutable_stop()->set_reason("cancelled by user");
  return message;
}

auto StatusCountIs(size_t n) {
  return [n](const Seen& seen) { return seen.Statuses().size() >= n; };
}

class AgentTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (agent_ != nullptr) {
      agent_->Shutdown();
      EXPECT_TRUE(WaitForRun().ok());
    }
    if (run_thread_.joinable()) run_thread_.join();
    StopServer();
  }

  void StartServer(FakeCoordinator::Options options = {}, int port = 0) {
    fake_ = std::make_unique<FakeCoordinator>(options);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(fake_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  void StopServer() {
    // Cancels open streams at once, like a coordinator process dying.
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_.reset();
    fake_.reset();
  }

  // `backoff_initial` and `wait_for_coordinator`: see WorkerAgentOptions.
  void StartAgent(Trainer* trainer = nullptr,
                  absl::Duration backoff_initial = absl::Milliseconds(10),
                  bool wait_for_coordinator = false, const Clock* clock = RealClock::Get()) {
    WorkerAgentOptions options;
    options.identity.worker_id = "w0";
    options.identity.host = "host-a";
    options.identity.device_kind = v1::DEVICE_KIND_CPU;
    options.identity.device_index = 3;
    options.identity.capabilities.set_cpu_cores(4);
    options.identity.capabilities.add_transports("ucx");
    options.identity.metrics_address = "127.0.0.1:9999";
    options.incarnation = Incarnation(kIncarnation);
    options.backoff.initial = backoff_initial;
    options.backoff.max = std::max(backoff_initial, absl::Milliseconds(100));
    options.welcome_timeout = absl::Seconds(2);
    std::shared_ptr<grpc::Channel> channel =
        NewCoordinatorChannel(CoordinatorTarget::Insecure(absl::StrCat("127.0.0.1:", port_)));
    if (wait_for_coordinator) {
      options.wait_for_coordinator = [this, channel](absl::Time deadline) {
        waited_for_coordinator_ = true;  // an attach failed: the agent waits to retry
        return channel->WaitForConnected(absl::ToChronoTime(deadline));
      };
    }
    registry_ = std::make_shared<prometheus::Registry>();
    agent_ = std::make_unique<WorkerAgent>(v1::Workers::NewStub(channel),
                                           trainer != nullptr ? trainer : &trainer_,
                                           clock, registry_, options);
    std::packaged_task<absl::Status()> task([this] { return agent_->Run(); });
    run_result_ = task.get_future();
    run_thread_ = std::thread(std::move(task));
  }

  // Run()'s result, or DeadlineExceeded if it has not returned within kWait.
  absl::Status WaitForRun() {
    if (run_result_.wait_for(absl::ToChronoSeconds(kWait)) != std::future_status::ready) {
      return absl::DeadlineExceededError("Run() did not return");
    }
    absl::Status status = run_result_.get();
    run_thread_.join();
    agent_.reset();
    return status;
  }

  bool AttachedAndWelcomed(int connection) {
    return fake_->WaitFor([connection](const Seen& seen) {
      return !seen.Of(WorkerMessage::kHeartbeat, connection).empty();
    });
  }

  int port_ = 0;
  std::atomic<bool> waited_for_coordinator_{false};
  std::unique_ptr<FakeCoordinator> fake_;
  std::unique_ptr<grpc::Server> server_;
  // Trainers and the clock outlive the agent (declared before it).
  SteppingClock stepping_clock_;
  IdleTrainer trainer_;
  FailingTrainer failing_trainer_;
  GatedTrainer gated_trainer_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<WorkerAgent> agent_;
  std::future<absl::Status> run_result_;
  std::thread run_thread_;
};

TEST_F(AgentTest, HelloCarriesIdentityIncarnationAndMetricsAddress) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(fake_->WaitFor([](const Seen& s) { return !s.messages.empty(); }));
  const WorkerMessage first = fake_->seen().messages.front().message;
  ASSERT_TRUE(first.has_hello());
  EXPECT_EQ(first.incarnation(), kIncarnation);
  const v1::Hello& hello = first.hello();
  EXPECT_EQ(hello.worker_id(), "w0");
  EXPECT_EQ(hello.host(), "host-a");
  EXPECT_EQ(hello.device_kind(), v1::DEVICE_KIND_CPU);
  EXPECT_EQ(hello.device_index(), 3);
  EXPECT_EQ(hello.incarnation(), kIncarnation);
  EXPECT_EQ(hello.metrics_address(), "127.0.0.1:9999");
  EXPECT_EQ(hello.capabilities().cpu_cores(), 4);
  EXPECT_THAT(hello.capabilities().transports(), ::testing::ElementsAre("ucx"));
  EXPECT_FALSE(hello.has_held());
}

TEST_F(AgentTest, HeartbeatsFollowTheWelcomeInterval) {
  StartServer({.heartbeat_interval_ms = 20});
  StartAgent();
  ASSERT_TRUE(
      fake_->WaitFor([](const Seen& s) { return s.Of(WorkerMessage::kHeartbeat).size() >= 6; }));
  const auto heartbeats = fake_->seen().Of(WorkerMessage::kHeartbeat);
  for (size_t i = 0; i < heartbeats.size(); ++i) {
    EXPECT_EQ(heartbeats[i].message.incarnation(), kIncarnation);
    EXPECT_EQ(heartbeats[i].message.heartbeat().sequence(), i + 1);
    EXPECT_EQ(heartbeats[i].message.heartbeat().job_id(), "");
  }
  // Five intervals of 20 ms (less any catch-up after a late first one), and far faster
  // than the agent's 1 s default, so the Welcome's value is the one in use.
  const absl::Duration span = heartbeats[5].at - heartbeats[0].at;
  EXPECT_GE(span, absl::Milliseconds(60));
  EXPECT_LT(span, absl::Seconds(3));
  EXPECT_EQ(agent_->metrics().attached.Value(), 1);
  // Counted when Write returns: the sixth may still be in flight.
  EXPECT_GE(agent_->metrics().heartbeats_sent.Value(), 5);
  EXPECT_GT(agent_->metrics().resident_memory.Value(), 0);
  // Acks of the first heartbeats arrived before the sixth was sent.
  EXPECT_GE(agent_->metrics().heartbeat_rtt.Collect().histogram.sample_count, 1u);
}

// A generation's first step is reported at once (the coordinator times a
// recovery's first step by it), not with the next heartbeat, a minute away
// here; the regular heartbeats keep their cadence.
TEST_F(AgentTest, ProgressAskedForNowGoesOutBeforeTheNextHeartbeat) {
  StartServer({.heartbeat_interval_ms = 60'000});
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_EQ(fake_->seen().Of(WorkerMessage::kHeartbeat).size(), 1u);
  const absl::Time asked = absl::Now();
  agent_->ReportProgressNow();
  ASSERT_TRUE(
      fake_->WaitFor([](const Seen& s) { return s.Of(WorkerMessage::kHeartbeat).size() >= 2; }))
      << "no heartbeat within " << kWait << " of ReportProgressNow";
  const auto heartbeats = fake_->seen().Of(WorkerMessage::kHeartbeat);
  EXPECT_LT(heartbeats[1].at - asked, absl::Seconds(5));
  EXPECT_EQ(heartbeats[1].message.heartbeat().sequence(), 2u);
  agent_->ReportProgressNow();
  ASSERT_TRUE(
      fake_->WaitFor([](const Seen& s) { return s.Of(WorkerMessage::kHeartbeat).size() >= 3; }));
}

TEST_F(AgentTest, AssignIsAnsweredReadyForTheSameJobAndGeneration) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 3, 1)));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(1)));
  const v1::AssignmentStatus status = fake_->seen().Statuses().at(0);
  EXPECT_EQ(status.job_id(), "job-1");
  EXPECT_EQ(status.generation(), 3u);
  EXPECT_EQ(status.state(), v1::ASSIGNMENT_STATE_READY);

  const std::optional<Assignment> prepared = trainer_.current();
  ASSERT_TRUE(prepared.has_value());
  EXPECT_EQ(prepared->job_id, JobId("job-1"));
  EXPECT_EQ(prepared->generation, Generation(3));
  EXPECT_EQ(prepared->coordinates.rank(), 1);
  EXPECT_EQ(prepared->spec.name(), "job-1");
  EXPECT_EQ(agent_->metrics().assignment_generation.Value(), 3);
  // Later heartbeats name the held assignment.
  ASSERT_TRUE(fake_->WaitFor([](const Seen& s) {
    const auto heartbeats = s.Of(WorkerMessage::kHeartbeat);
    return !heartbeats.empty() && heartbeats.back().message.heartbeat().job_id() == "job-1" &&
           heartbeats.back().message.heartbeat().generation() == 3;
  }));
}

TEST_F(AgentTest, CommandsOfOlderGenerationsAreIgnored) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 5, 0)));
  // Commands run in order, so the Reconfigure's READY proves the stale ones
  // before it were seen and passed over.
  ASSERT_TRUE(fake_->Send(StopMessage("job-1", 4)));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 2, 0)));
  ASSERT_TRUE(fake_->Send(ReconfigureMessage("job-1", 4, 0)));
  ASSERT_TRUE(fake_->Send(ReconfigureMessage("job-1", 6, 2)));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(2)));
  const auto statuses = fake_->seen().Statuses();
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].generation(), 5u);
  EXPECT_EQ(statuses[0].state(), v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(statuses[1].generation(), 6u);
  EXPECT_EQ(statuses[1].state(), v1::ASSIGNMENT_STATE_READY);
  const std::optional<Assignment> prepared = trainer_.current();
  ASSERT_TRUE(prepared.has_value());
  EXPECT_EQ(prepared->generation, Generation(6));
  EXPECT_EQ(prepared->coordinates.rank(), 2);
  EXPECT_EQ(prepared->mesh.data_parallel(), 3);
  EXPECT_EQ(prepared->spec.name(), "job-1");  // kept from the Assign
}

TEST_F(AgentTest, WarmUpsReachTheTrainerInOrderAndNeverWhileItHoldsAJob) {
  WarmingTrainer trainer;
  StartServer();
  StartAgent(&trainer);
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(WarmUpMessage("job-a", 2)));
  ASSERT_TRUE(fake_->Send(WarmUpMessage("job-b", 1)));  // older: crossed with the one above
  ASSERT_TRUE(fake_->Send(AssignMessage("job-c", 1, 0)));
  ASSERT_TRUE(fake_->Send(WarmUpMessage("job-a", 3)));  // sent before the Assign, arrived after
  ASSERT_TRUE(fake_->Send(StopMessage("job-c", 1)));
  // Commands run in order: the RELEASED proves every WarmUp before it was seen.
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(2)));
  EXPECT_EQ(trainer.warmed(), std::vector<std::string>({"job-a"}));
  // Idle again: a newer one applies, a release too.
  ASSERT_TRUE(fake_->Send(WarmUpMessage("job-d", 4)));
  ASSERT_TRUE(fake_->WaitFor([](const Seen& s) {
    const auto heartbeats = s.Of(WorkerMessage::kHeartbeat);
    return !heartbeats.empty() && heartbeats.back().message.heartbeat().warm().job_id() == "job-d";
  }));
  EXPECT_EQ(agent_->metrics().warm_spare_memory.Value(), 4096);
  ASSERT_TRUE(fake_->Send(WarmUpMessage("", 5)));
  ASSERT_TRUE(fake_->WaitFor([](const Seen& s) {
    const auto heartbeats = s.Of(WorkerMessage::kHeartbeat);
    return !heartbeats.empty() && !heartbeats.back().message.heartbeat().has_warm();
  }));
  EXPECT_EQ(trainer.warmed(), std::vector<std::string>({"job-a", "job-d", ""}));
  agent_->Shutdown();
  EXPECT_TRUE(WaitForRun().ok());  // before `trainer` goes
}

TEST_F(AgentTest, StopReleasesTheAssignment) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 1, 0)));
  ASSERT_TRUE(fake_->Send(StopMessage("job-1", 1)));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(2)));
  const v1::AssignmentStatus released = fake_->seen().Statuses().at(1);
  EXPECT_EQ(released.job_id(), "job-1");
  EXPECT_EQ(released.generation(), 1u);
  EXPECT_EQ(released.state(), v1::ASSIGNMENT_STATE_RELEASED);
  EXPECT_FALSE(agent_->held().has_value());
  EXPECT_FALSE(trainer_.current().has_value());
  EXPECT_EQ(agent_->metrics().assignment_generation.Value(), 0);
}

TEST_F(AgentTest, ReconfigureOfAJobNotHeldFails) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(ReconfigureMessage("job-9", 2, 0)));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(1)));
  const v1::AssignmentStatus status = fake_->seen().Statuses().at(0);
  EXPECT_EQ(status.job_id(), "job-9");
  EXPECT_EQ(status.state(), v1::ASSIGNMENT_STATE_FAILED);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("does not hold job job-9"));
}

// A member's Assign of generation 2 was overtaken by the Reconfigure of
// generation 3 (the coordinator re-planned before it arrived): it joins from
// the Reconfigure, which carries the spec, and the late Assign is stale.
TEST_F(AgentTest, ReconfigureWithASpecJoinsAJobWhoseAssignWasOvertaken) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  CoordinatorMessage reconfigure = ReconfigureMessage("job-9", 3, 1);
  reconfigure.mutable_reconfigure()->set_role(v1::RECONFIGURE_ROLE_MEMBER);
  reconfigure.mutable_reconfigure()->mutable_spec()->set_name("job");
  ASSERT_TRUE(fake_->Send(reconfigure));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(1)));
  const v1::AssignmentStatus status = fake_->seen().Statuses().at(0);
  EXPECT_EQ(status.job_id(), "job-9");
  EXPECT_EQ(status.generation(), 3u);
  EXPECT_EQ(status.state(), v1::ASSIGNMENT_STATE_READY);
  ASSERT_TRUE(trainer_.current().has_value());
  EXPECT_EQ(trainer_.current()->generation, Generation(3));
  EXPECT_EQ(trainer_.current()->spec.name(), "job");
  CoordinatorMessage late;
  v1::Assign* assign = late.mutable_assign();
  assign->set_job_id("job-9");
  assign->set_generation(2);
  assign->mutable_coordinates()->set_rank(0);
  ASSERT_TRUE(fake_->Send(late));
  ASSERT_TRUE(fake_->Send(StopMessage("job-other", 1)));  // a marker after it
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(2)));
  EXPECT_EQ(fake_->seen().Statuses().at(1).job_id(), "job-other");  // no status for the Assign
  EXPECT_EQ(trainer_.current()->generation, Generation(3));
}

TEST_F(AgentTest, PrepareErrorIsReportedFailedAndNothingIsHeld) {
  StartServer();
  StartAgent(&failing_trainer_);
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 1, 0)));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(1)));
  const v1::AssignmentStatus status = fake_->seen().Statuses().at(0);
  EXPECT_EQ(status.state(), v1::ASSIGNMENT_STATE_FAILED);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("model does not fit in 1 MiB"));
  EXPECT_FALSE(agent_->held().has_value());
}

TEST_F(AgentTest, BrokenStreamReattachesWithTheHeldAssignment) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 2, 1)));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(1)));
  fake_->BreakStream();
  ASSERT_TRUE(
      fake_->WaitFor([](const Seen& s) { return !s.Of(WorkerMessage::kHello, 1).empty(); }));
  const WorkerMessage hello = fake_->seen().Of(WorkerMessage::kHello, 1).at(0).message;
  EXPECT_EQ(hello.incarnation(), kIncarnation);
  ASSERT_TRUE(hello.hello().has_held());
  EXPECT_EQ(hello.hello().held().job_id(), "job-1");
  EXPECT_EQ(hello.hello().held().generation(), 2u);
  EXPECT_EQ(hello.hello().held().coordinates().rank(), 1);
  // The trainer kept running through the outage.
  ASSERT_TRUE(trainer_.current().has_value());
  EXPECT_EQ(trainer_.current()->generation, Generation(2));
  EXPECT_GE(agent_->metrics().reconnects.Value(), 1);
  ASSERT_TRUE(AttachedAndWelcomed(1));
}

TEST_F(AgentTest, CoordinatorRestartOnTheSamePortIsRejoined) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 7, 0)));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(1)));
  const int port = port_;
  StopServer();
  StartServer({}, port);
  ASSERT_EQ(port_, port);
  ASSERT_TRUE(
      fake_->WaitFor([](const Seen& s) { return !s.Of(WorkerMessage::kHello, 0).empty(); }));
  const v1::Hello hello = fake_->seen().Of(WorkerMessage::kHello, 0).at(0).message.hello();
  EXPECT_EQ(hello.held().job_id(), "job-1");
  EXPECT_EQ(hello.held().generation(), 7u);
  ASSERT_TRUE(AttachedAndWelcomed(0));
  EXPECT_GE(agent_->metrics().reconnects.Value(), 1);
}

// A worker started before its coordinator: its retry ends as soon as the
// channel connects, not after its backoff delay (here 20 s, far beyond the
// bound on the wait below; the channel's own reconnect backoff is at most
// 1 s).
TEST_F(AgentTest, AWorkerStartedBeforeItsCoordinatorAttachesOnceItListens) {
  port_ = testing::PickFreePort();
  StartAgent(nullptr, /*backoff_initial=*/absl::Seconds(20), /*wait_for_coordinator=*/true);
  ASSERT_TRUE(testing::WaitUntil([&] { return waited_for_coordinator_.load(); }, kWait))
      << "the first attach never failed";
  const int port = port_;
  const absl::Time listening = absl::Now();
  StartServer({}, port);
  ASSERT_EQ(port_, port);
  ASSERT_TRUE(testing::WaitUntil([&] { return fake_->seen().connections >= 1; }, absl::Seconds(5)))
      << "not attached within 5 s of the coordinator listening (backoff delay 20 s)";
  std::printf("attached %.0f ms after the coordinator started listening\n",
              absl::ToDoubleMilliseconds(absl::Now() - listening));
  ASSERT_TRUE(AttachedAndWelcomed(0));
}

TEST_F(AgentTest, RefusedAttachIsRetried) {
  StartServer({.refuse_attaches = 2});
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  EXPECT_EQ(fake_->seen().refused, 2);
  EXPECT_GE(agent_->metrics().reconnects.Value(), 2);
}

TEST_F(AgentTest, SilentCoordinatorIsAbandonedAfterTheHeartbeatTimeout) {
  StartServer({.heartbeat_interval_ms = 10, .heartbeat_timeout_ms = 100, .ack_heartbeats = false});
  StartAgent();
  ASSERT_TRUE(
      fake_->WaitFor([](const Seen& s) { return !s.Of(WorkerMessage::kHello, 1).empty(); }));
  const Seen seen = fake_->seen();
  EXPECT_TRUE(seen.ended.at(0));
}

TEST_F(AgentTest, TheHeartbeatTimeoutIsMeasuredOnTheAgentsClock) {
  // Twenty seconds of silence on the agent's clock, hardly any in real time,
  // abandon the stream: the agent reads all its time from its Clock (here
  // one that moves a second at every reading). On the real clock it would
  // keep the stream past this test's deadline.
  StartServer({.heartbeat_interval_ms = 500, .heartbeat_timeout_ms = 20'000,
               .ack_heartbeats = false});
  StartAgent(nullptr, /*backoff_initial=*/absl::ZeroDuration(), false, &stepping_clock_);
  ASSERT_TRUE(AttachedAndWelcomed(0));
  stepping_clock_.StartStepping();
  ASSERT_TRUE(
      fake_->WaitFor([](const Seen& s) { return !s.Of(WorkerMessage::kHello, 1).empty(); }));
  EXPECT_TRUE(fake_->seen().ended.at(0));
}

TEST_F(AgentTest, StatusDecidedWhileAwayIsSentAfterReattaching) {
  GatedTrainer& gated = gated_trainer_;
  StartServer();
  StartAgent(&gated);
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 4, 0)));
  ASSERT_TRUE(gated.WaitUntilPreparing());
  fake_->BreakStream();
  // Heartbeats continue on the new stream while Prepare is still running.
  ASSERT_TRUE(AttachedAndWelcomed(1));
  EXPECT_EQ(fake_->seen().Of(WorkerMessage::kHello, 1).at(0).message.hello().held().generation(),
            4u);
  EXPECT_TRUE(fake_->seen().Statuses().empty());
  gated.Release();
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(1)));
  const auto statuses = fake_->seen().Of(WorkerMessage::kStatus);
  EXPECT_EQ(statuses.at(0).connection, 1);
  EXPECT_EQ(statuses.at(0).message.status().state(), v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(statuses.at(0).message.status().generation(), 4u);
}

TEST_F(AgentTest, DrainReleasesClosesTheStreamAndRunReturnsOk) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  ASSERT_TRUE(fake_->Send(AssignMessage("job-1", 3, 0)));
  ASSERT_TRUE(fake_->WaitFor(StatusCountIs(1)));
  CoordinatorMessage drain;
  drain.mutable_drain()->set_reason("scale down");
  ASSERT_TRUE(fake_->Send(drain));
  EXPECT_TRUE(WaitForRun().ok());
  const Seen seen = fake_->seen();
  ASSERT_EQ(seen.Statuses().size(), 2u);
  EXPECT_EQ(seen.Statuses()[1].job_id(), "job-1");
  EXPECT_EQ(seen.Statuses()[1].generation(), 3u);
  EXPECT_EQ(seen.Statuses()[1].state(), v1::ASSIGNMENT_STATE_RELEASED);
  // The worker announced its departure, then half-closed; nothing was cancelled.
  ASSERT_TRUE(fake_->WaitFor([](const Seen& s) { return s.ended.at(0); }));
  EXPECT_FALSE(fake_->seen().cancelled.at(0));
  EXPECT_EQ(fake_->seen().Of(WorkerMessage::kLeave).size(), 1u);
  EXPECT_EQ(seen.connections, 1);
  EXPECT_FALSE(trainer_.current().has_value());
}

TEST_F(AgentTest, ShutdownClosesTheStreamAndRunReturnsOk) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  agent_->Shutdown();
  EXPECT_TRUE(WaitForRun().ok());
  ASSERT_TRUE(fake_->WaitFor([](const Seen& s) { return s.ended.at(0); }));
  EXPECT_FALSE(fake_->seen().cancelled.at(0));
  // The last message announced the departure, so it is not taken for a failure.
  const Seen seen = fake_->seen();  // complete: the stream has ended
  ASSERT_FALSE(seen.messages.empty());
  EXPECT_TRUE(seen.messages.back().message.has_leave());
  EXPECT_EQ(seen.Of(WorkerMessage::kLeave).size(), 1u);
}

TEST_F(AgentTest, ShutdownWhileTheCoordinatorIsAwayReturnsOk) {
  StartServer();
  const int port = port_;
  StopServer();
  port_ = port;  // nothing listens here now
  StartAgent();
  agent_->Shutdown();
  EXPECT_TRUE(WaitForRun().ok());
}

TEST_F(AgentTest, RunTwiceIsRefused) {
  StartServer();
  StartAgent();
  ASSERT_TRUE(AttachedAndWelcomed(0));
  EXPECT_EQ(agent_->Run().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cohort::worker
