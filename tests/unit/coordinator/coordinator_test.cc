#include "coordinator/coordinator.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/proto_time.h"
#include "coordinator/attach_protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_specs.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

class RecordingSink : public WorkerSink {
 public:
  void Send(v1::CoordinatorMessage message) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back(std::move(message));
  }
  std::vector<v1::CoordinatorMessage> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(messages_, {});
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> messages_ ABSL_GUARDED_BY(mu_);
};

class RecordingWatch : public JobEventSink {
 public:
  void OnEvent(const v1::JobEvent& event) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
  }
  void OnFinished() override {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  std::vector<v1::JobEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  bool finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Coordinator::Options options;
    options.heartbeat_interval = absl::Milliseconds(500);
    options.heartbeat_timeout = absl::Seconds(3);
    options.max_kv_wait = absl::Seconds(60);
    auto coordinator = Coordinator::Create(options, std::make_unique<InMemoryJobStore>(), &clock_,
                                           &metrics_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
  }

  std::shared_ptr<RecordingSink> Attach(const std::string& id, uint64_t incarnation) {
    auto sink = std::make_shared<RecordingSink>();
    v1::Hello hello;
    hello.set_worker_id(id);
    hello.set_host("h");
    hello.set_device_kind(v1::DEVICE_KIND_CPU);
    hello.set_incarnation(incarnation);
    auto welcome = coordinator_->Attach(hello, sink);
    EXPECT_TRUE(welcome.ok()) << welcome.status();
    return sink;
  }

  absl::Status Heartbeat(const std::string& id, uint64_t incarnation) {
    v1::WorkerMessage message;
    message.set_incarnation(incarnation);
    message.mutable_heartbeat()->set_sequence(1);
    return coordinator_->OnWorkerMessage(WorkerId(id), message);
  }

  // The worker answers a Suspend of `job`'s current generation.
  absl::Status Suspended(const std::string& id, uint64_t incarnation, const v1::Job& job) {
    v1::WorkerMessage message;
    message.set_incarnation(incarnation);
    v1::AssignmentStatus* status = message.mutable_status();
    status->set_job_id(job.job_id());
    status->set_generation(coordinator_->GetJob(JobId(job.job_id()))->generation());
    status->set_state(v1::ASSIGNMENT_STATE_SUSPENDED);
    return coordinator_->OnWorkerMessage(WorkerId(id), message);
  }

  v1::Job SubmitRunningJob() {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = testing::SmallJobSpec("kv", 2, 2, 2);
    auto job = coordinator_->Submit(request);
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
    return *job;
  }

  FakeClock clock_;
  CoordinatorMetrics metrics_{std::make_shared<prometheus::Registry>()};
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, RejectsInconsistentHeartbeatOptions) {
  Coordinator::Options options;
  options.heartbeat_interval = absl::Seconds(3);
  options.heartbeat_timeout = absl::Seconds(1);
  auto coordinator =
      Coordinator::Create(options, std::make_unique<InMemoryJobStore>(), &clock_, &metrics_);
  EXPECT_EQ(coordinator.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(coordinator.status().message(), HasSubstr("heartbeat_timeout"));
}

// Issue 21: one response held every job and worker, which at scale outgrew
// what gRPC clients accept by default. Pages follow the last key returned.
TEST_F(CoordinatorTest, JobsAndWorkersAreListedInPagesThatFollowTheLastKey) {
  for (int i = 0; i < 5; ++i) Attach(absl::StrCat("w", i), 100 + i);
  v1::ListWorkersRequest workers;
  workers.set_page_size(2);
  std::vector<std::string> seen;
  for (int page = 0;; ++page) {
    ASSERT_LT(page, 5);
    absl::StatusOr<v1::ListWorkersResponse> got = coordinator_->ListWorkersPage(workers);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_LE(got->workers_size(), 2);
    for (const auto& w : got->workers()) seen.push_back(w.worker_id());
    if (got->next_page_token().empty()) break;
    workers.set_page_token(got->next_page_token());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"w0", "w1", "w2", "w3", "w4"}));

  std::vector<std::string> submitted;
  for (int i = 0; i < 3; ++i) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = testing::SmallJobSpec(absl::StrCat("page", i), 1, 1, 1);
    absl::StatusOr<v1::Job> job = coordinator_->Submit(request);
    ASSERT_TRUE(job.ok()) << job.status();
    submitted.push_back(job->job_id());
  }
  v1::ListJobsRequest jobs;
  jobs.set_page_size(2);
  absl::StatusOr<v1::ListJobsResponse> first = coordinator_->ListJobsPage(jobs);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->jobs_size(), 2);
  ASSERT_FALSE(first->next_page_token().empty());
  jobs.set_page_token(first->next_page_token());
  absl::StatusOr<v1::ListJobsResponse> second = coordinator_->ListJobsPage(jobs);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->jobs_size(), 1);
  EXPECT_TRUE(second->next_page_token().empty());
  EXPECT_EQ(second->jobs(0).job_id(), submitted[2]);

  jobs.set_page_token("workers/w1");
  EXPECT_THAT(coordinator_->ListJobsPage(jobs).status().message(), HasSubstr("page_token:"));
  jobs.clear_page_token();
  jobs.set_page_size(1001);
  EXPECT_THAT(coordinator_->ListJobsPage(jobs).status().message(),
              HasSubstr("page_size: 1001 is outside [0, 1000]"));
}

// Issue 21: a missing checkpoint to resume from hid the spec's other errors.
TEST_F(CoordinatorTest, AMissingResumeCheckpointIsReportedWithTheSpecsOtherErrors) {
  Coordinator::Options options;
  options.checkpoint_exists = [](const JobId& job, std::optional<Step>) {
    return absl::NotFoundError(absl::StrCat("job ", job.value(), " has no checkpoint"));
  };
  auto coordinator =
      Coordinator::Create(options, std::make_unique<InMemoryJobStore>(), &clock_, &metrics_);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallJobSpec("resume", 1, 1, 1);
  request.mutable_spec()->set_steps(-1);
  request.mutable_spec()->mutable_checkpoint()->set_resume_from_job("base-1");
  absl::StatusOr<v1::Job> refused = (*coordinator)->Submit(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("steps: must be > 0"));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("checkpoint.resume_from_job: job base-1 has no checkpoint"));
  // A malformed id is the validator's error alone (and is not echoed).
  request.mutable_spec()->mutable_checkpoint()->set_resume_from_job(std::string(1 << 20, 'X'));
  refused = (*coordinator)->Submit(request);
  EXPECT_THAT(refused.status().message(), HasSubstr("checkpoint.resume_from_job: <1048576 bytes"));
  EXPECT_THAT(refused.status().message(), ::testing::Not(HasSubstr("has no checkpoint")));
}

// The coordinator's own stall (no tick for longer than stall_threshold)
// does not count against the workers: nobody is lost for the silence it
// caused; silence after it still counts.
TEST_F(CoordinatorTest, ItsOwnStallIsNotCountedAgainstTheWorkers) {
  for (const bool compensate : {false, true}) {
    Coordinator::Options options;
    options.heartbeat_interval = absl::Milliseconds(500);
    options.heartbeat_timeout = absl::Seconds(3);
    if (compensate) options.stall_threshold = absl::Seconds(1);
    auto created =
        Coordinator::Create(options, std::make_unique<InMemoryJobStore>(), &clock_, &metrics_);
    ASSERT_TRUE(created.ok());
    coordinator_ = *std::move(created);
    const uint64_t incarnation = compensate ? 20 : 10;
    auto sink = Attach("w0", incarnation);
    coordinator_->Tick();
    clock_.Advance(absl::Seconds(5));  // stopped: no tick, no heartbeat handled
    coordinator_->Tick();
    auto lost = [&] {
      for (const auto& w : coordinator_->ListWorkers()) {
        if (w.worker_id() == "w0") return w.state() == v1::WORKER_STATE_LOST;
      }
      return false;
    };
    EXPECT_EQ(lost(), !compensate) << "compensate " << compensate;
    if (!compensate) continue;
    // Ordinary ticks: the worker's own silence counts again.
    for (int i = 0; i < 70 && !lost(); ++i) {
      clock_.Advance(absl::Milliseconds(50));
      coordinator_->Tick();
    }
    EXPECT_TRUE(lost());
  }
}

// An Attach stream's protocol (attach_protocol.h), as the server and the
// RPC fuzzer run it: the Hello's checks come before anything is attached,
// and errors that are the worker's business do not end the stream.
TEST_F(CoordinatorTest, AnAttachStreamAttachesOnlyAValidPermittedHello) {
  auto sink = std::make_shared<RecordingSink>();
  std::optional<AttachedWorker> attached;
  v1::WorkerMessage hello;
  hello.set_incarnation(7);
  hello.mutable_hello()->set_worker_id("w0");
  hello.mutable_hello()->set_host("h");
  hello.mutable_hello()->set_device_kind(v1::DEVICE_KIND_CPU);
  hello.mutable_hello()->set_incarnation(7);
  v1::WorkerMessage heartbeat;
  heartbeat.set_incarnation(7);
  heartbeat.mutable_heartbeat()->set_sequence(1);

  absl::Status status =
      HandleAttachMessage(*coordinator_, WorkerIdentity::Any(), heartbeat, sink, attached);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("must be a Hello"));

  v1::WorkerMessage mismatched = hello;
  mismatched.set_incarnation(8);
  status = HandleAttachMessage(*coordinator_, WorkerIdentity::Any(), mismatched, sink, attached);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("incarnation"));

  const WorkerIdentity only_w1 = WorkerIdentity::FromUris({"cohort://worker/w1"});
  status = HandleAttachMessage(*coordinator_, only_w1, hello, sink, attached);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(status.message(), HasSubstr("hello.worker_id"));
  EXPECT_FALSE(attached.has_value());
  EXPECT_TRUE(sink->Take().empty());  // nothing attached, no Welcome

  ASSERT_TRUE(
      HandleAttachMessage(*coordinator_, WorkerIdentity::Any(), hello, sink, attached).ok());
  ASSERT_TRUE(attached.has_value());
  EXPECT_EQ(attached->id, WorkerId("w0"));
  EXPECT_EQ(attached->incarnation, Incarnation(7));
  std::vector<v1::CoordinatorMessage> messages = sink->Take();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_TRUE(messages[0].has_welcome());

  // Later messages go to the coordinator as w0.
  ASSERT_TRUE(
      HandleAttachMessage(*coordinator_, WorkerIdentity::Any(), heartbeat, sink, attached).ok());
  messages = sink->Take();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].heartbeat_ack().sequence(), 1u);
  // A status about a job the coordinator does not have is the worker's
  // business: the stream goes on.
  v1::WorkerMessage unknown;
  unknown.set_incarnation(7);
  unknown.mutable_status()->set_job_id("no-such-job");
  unknown.mutable_status()->set_generation(1);
  unknown.mutable_status()->set_state(v1::ASSIGNMENT_STATE_READY);
  EXPECT_TRUE(
      HandleAttachMessage(*coordinator_, WorkerIdentity::Any(), unknown, sink, attached).ok());
  // Another incarnation's message is fenced off, and that ends the stream.
  v1::WorkerMessage stale = heartbeat;
  stale.set_incarnation(6);
  EXPECT_EQ(HandleAttachMessage(*coordinator_, WorkerIdentity::Any(), stale, sink, attached).code(),
            absl::StatusCode::kAborted);
}

TEST_F(CoordinatorTest, WelcomeComesFirstAndHeartbeatsAreAcked) {
  auto sink = Attach("w0", 11);
  auto messages = sink->Take();
  ASSERT_EQ(messages.size(), 1u);
  ASSERT_TRUE(messages[0].has_welcome());
  EXPECT_EQ(messages[0].welcome().heartbeat_interval_ms(), 500u);
  EXPECT_EQ(messages[0].welcome().heartbeat_timeout_ms(), 3000u);
  ASSERT_TRUE(Heartbeat("w0", 11).ok());
  messages = sink->Take();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].heartbeat_ack().sequence(), 1u);
  // A message from another incarnation of w0 is fenced off.
  EXPECT_EQ(Heartbeat("w0", 12).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Heartbeat("nobody", 1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, MissedHeartbeatsLoseTheWorkerAndReplanItsJob) {
  auto s0 = Attach("w0", 1);
  auto s1 = Attach("w1", 2);
  auto s2 = Attach("w2", 3);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallJobSpec("hb", 1, 2, 2);
  auto job = coordinator_->Submit(request);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->mesh().members_size(), 2);
  s0->Take();
  s1->Take();
  s2->Take();
  // w0 and w2 keep heartbeating; w1 goes silent. The job holds two of the three.
  for (int i = 0; i < 7; ++i) {
    clock_.Advance(absl::Milliseconds(500));
    ASSERT_TRUE(Heartbeat("w0", 1).ok());
    ASSERT_TRUE(Heartbeat("w2", 3).ok());
    coordinator_->Tick();
  }
  auto workers = coordinator_->ListWorkers();
  for (const auto& w : workers) {
    EXPECT_EQ(w.state() == v1::WORKER_STATE_LOST, w.worker_id() == "w1") << w.worker_id();
  }
  // The survivor is suspended first; the new generation follows its answer.
  bool suspended = false;
  for (const auto& m : s0->Take()) suspended |= m.has_suspend();
  EXPECT_TRUE(suspended);
  EXPECT_EQ(coordinator_->GetJob(JobId(job->job_id()))->generation(), 1u);
  ASSERT_TRUE(Suspended("w0", 1, *job).ok());
  auto after = coordinator_->GetJob(JobId(job->job_id()));
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->generation(), 2u);
  for (const auto& m : after->mesh().members()) EXPECT_NE(m.worker_id(), "w1");
}

// Value of a counter without labels in the coordinator's registry.
double CounterValue(const CoordinatorMetrics& metrics, const std::string& name) {
  for (const auto& family : metrics.registry()->Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].counter.value;
  }
  return -1;
}

// Whether `id` is LOST in the coordinator's list.
bool IsLost(Coordinator& coordinator, const std::string& id) {
  for (const auto& w : coordinator.ListWorkers()) {
    if (w.worker_id() == id) return w.state() == v1::WORKER_STATE_LOST;
  }
  return false;
}

TEST_F(CoordinatorTest, HearingFromNoWorkerIsItsOwnIsolationAndFencesNoOne) {
  auto s0 = Attach("w0", 1);
  auto s1 = Attach("w1", 2);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallJobSpec("iso", 1, 2, 2);
  auto job = coordinator_->Submit(request);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->mesh().members_size(), 2);
  EXPECT_EQ(coordinator_->IsolationSilence(), absl::Milliseconds(1500));
  // Silence from both for 20 s, far past the 3 s heartbeat timeout.
  for (int i = 0; i < 400; ++i) {
    clock_.Advance(absl::Milliseconds(50));
    coordinator_->Tick();
  }
  EXPECT_TRUE(coordinator_->isolated());
  EXPECT_FALSE(IsLost(*coordinator_, "w0"));
  EXPECT_FALSE(IsLost(*coordinator_, "w1"));
  // w1's stream ends meanwhile (keepalives failing across the cut): that
  // says nothing while cut off from everyone.
  coordinator_->Detach(WorkerId("w1"), Incarnation(2), s1.get());
  EXPECT_FALSE(IsLost(*coordinator_, "w1"));
  EXPECT_EQ(coordinator_->GetJob(JobId(job->job_id()))->generation(), 1u);
  // w0 is heard again: isolation ends; w1 gets the re-adoption grace (10 s).
  ASSERT_TRUE(Heartbeat("w0", 1).ok());
  coordinator_->Tick();
  EXPECT_FALSE(coordinator_->isolated());
  for (int i = 0; i < 180; ++i) {  // 9 s
    clock_.Advance(absl::Milliseconds(50));
    if (i % 10 == 0) {
      ASSERT_TRUE(Heartbeat("w0", 1).ok());
    }
    coordinator_->Tick();
  }
  EXPECT_FALSE(IsLost(*coordinator_, "w1"));
  // w1 attaches again (the same process, holding its place): re-adopted.
  v1::Hello hello;
  hello.set_worker_id("w1");
  hello.set_host("h");
  hello.set_device_kind(v1::DEVICE_KIND_CPU);
  hello.set_incarnation(2);
  hello.mutable_held()->set_job_id(job->job_id());
  hello.mutable_held()->set_generation(1);
  for (const auto& m : job->mesh().members()) {
    if (m.worker_id() == "w1") *hello.mutable_held()->mutable_coordinates() = m.coordinates();
  }
  ASSERT_TRUE(coordinator_->Attach(hello, std::make_shared<RecordingSink>()).ok());
  for (int i = 0; i < 100; ++i) {  // 5 s more, both heard
    clock_.Advance(absl::Milliseconds(50));
    if (i % 10 == 0) {
      ASSERT_TRUE(Heartbeat("w0", 1).ok());
      ASSERT_TRUE(Heartbeat("w1", 2).ok());
    }
    coordinator_->Tick();
  }
  EXPECT_FALSE(IsLost(*coordinator_, "w0"));
  EXPECT_FALSE(IsLost(*coordinator_, "w1"));
  EXPECT_EQ(coordinator_->GetJob(JobId(job->job_id()))->generation(), 1u);
  EXPECT_EQ(CounterValue(metrics_, "cohort_coordinator_isolations_total"), 1);
}

TEST_F(CoordinatorTest, AWorkerStillSilentAfterTheIsolationOrPastItsLimitIsFenced) {
  for (const bool heard : {true, false}) {
    Coordinator::Options options;
    options.heartbeat_interval = absl::Milliseconds(500);
    options.heartbeat_timeout = absl::Seconds(3);
    options.isolation_limit = absl::Seconds(30);
    auto created =
        Coordinator::Create(options, std::make_unique<InMemoryJobStore>(), &clock_, &metrics_);
    ASSERT_TRUE(created.ok());
    coordinator_ = *std::move(created);
    auto s0 = Attach("w0", 1);
    auto s1 = Attach("w1", 2);
    for (int i = 0; i < 100; ++i) {  // 5 s of silence
      clock_.Advance(absl::Milliseconds(50));
      coordinator_->Tick();
    }
    ASSERT_TRUE(coordinator_->isolated());
    // Heard from w0 (ends it; w1 has 10 s), or from nobody (the limit ends it).
    const int ticks = heard ? 220 : 600;
    for (int i = 0; i < ticks; ++i) {
      clock_.Advance(absl::Milliseconds(50));
      if (heard && i % 10 == 0) {
        ASSERT_TRUE(Heartbeat("w0", 1).ok());
      }
      coordinator_->Tick();
    }
    EXPECT_FALSE(coordinator_->isolated()) << "heard " << heard;
    EXPECT_TRUE(IsLost(*coordinator_, "w1")) << "heard " << heard;
    EXPECT_EQ(IsLost(*coordinator_, "w0"), !heard) << "heard " << heard;
  }
}

TEST_F(CoordinatorTest, OneSilentWorkerAmongHeardOnesIsNoIsolation) {
  auto s0 = Attach("w0", 1);
  auto s1 = Attach("w1", 2);
  for (int i = 0; i < 80; ++i) {  // 4 s: w1 silent, w0 heard
    clock_.Advance(absl::Milliseconds(50));
    if (i % 10 == 0) {
      ASSERT_TRUE(Heartbeat("w0", 1).ok());
    }
    coordinator_->Tick();
  }
  EXPECT_FALSE(coordinator_->isolated());
  EXPECT_TRUE(IsLost(*coordinator_, "w1"));
  // A lone worker's silence is its own: nothing to compare with.
  for (int i = 0; i < 80; ++i) {
    clock_.Advance(absl::Milliseconds(50));
    coordinator_->Tick();
  }
  EXPECT_FALSE(coordinator_->isolated());
  EXPECT_TRUE(IsLost(*coordinator_, "w0"));
}

// A sink that records being closed.
class ClosableSink : public RecordingSink {
 public:
  void Close() override { closed = true; }
  bool closed = false;
};

TEST_F(CoordinatorTest, TheSameProcessOnANewStreamTakesItsPlaceOverWithoutALoss) {
  auto s0 = Attach("w0", 1);
  auto s1 = std::make_shared<ClosableSink>();
  v1::Hello hello;
  hello.set_worker_id("w1");
  hello.set_host("h");
  hello.set_device_kind(v1::DEVICE_KIND_CPU);
  hello.set_incarnation(2);
  ASSERT_TRUE(coordinator_->Attach(hello, s1).ok());
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallJobSpec("takeover", 1, 2, 2);
  auto job = coordinator_->Submit(request);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->mesh().members_size(), 2);
  // Both report themselves running, so the job runs with both ready.
  for (const char* id : {"w0", "w1"}) {
    v1::WorkerMessage ready;
    ready.set_incarnation(std::string(id) == "w0" ? 1 : 2);
    v1::AssignmentStatus* status = ready.mutable_status();
    status->set_job_id(job->job_id());
    status->set_generation(1);
    status->set_state(v1::ASSIGNMENT_STATE_READY);
    ASSERT_TRUE(coordinator_->OnWorkerMessage(WorkerId(id), ready).ok());
  }
  ASSERT_EQ(coordinator_->GetJob(JobId(job->job_id()))->ready_workers(), 2);
  // w1 (the same process) attaches again holding its place.
  auto replacement = std::make_shared<ClosableSink>();
  hello.mutable_held()->set_job_id(job->job_id());
  hello.mutable_held()->set_generation(1);
  for (const auto& m : job->mesh().members()) {
    if (m.worker_id() == "w1") *hello.mutable_held()->mutable_coordinates() = m.coordinates();
  }
  ASSERT_TRUE(coordinator_->Attach(hello, replacement).ok());
  EXPECT_TRUE(s1->closed);
  EXPECT_FALSE(replacement->closed);
  EXPECT_FALSE(IsLost(*coordinator_, "w1"));
  v1::Job after = *coordinator_->GetJob(JobId(job->job_id()));
  EXPECT_EQ(after.generation(), 1u);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.ready_workers(), 2);
  EXPECT_EQ(CounterValue(metrics_, "cohort_attach_stream_takeovers_total"), 1);
  // The old stream's messages are dropped and its end is no loss.
  v1::WorkerMessage leave;
  leave.set_incarnation(2);
  leave.mutable_leave();
  EXPECT_TRUE(coordinator_->OnWorkerMessage(WorkerId("w1"), leave, s1.get()).ok());
  EXPECT_FALSE(IsLost(*coordinator_, "w1"));
  coordinator_->Detach(WorkerId("w1"), Incarnation(2), s1.get());
  EXPECT_FALSE(IsLost(*coordinator_, "w1"));
  EXPECT_EQ(coordinator_->GetJob(JobId(job->job_id()))->generation(), 1u);
  // The new stream is the worker's: heartbeats are acked on it.
  replacement->Take();
  ASSERT_TRUE(coordinator_->OnWorkerMessage(WorkerId("w1"), [] {
    v1::WorkerMessage m;
    m.set_incarnation(2);
    m.mutable_heartbeat()->set_sequence(5);
    return m;
  }(), replacement.get()).ok());
  const auto acks = replacement->Take();
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].heartbeat_ack().sequence(), 5u);
  // Its end is a loss.
  coordinator_->Detach(WorkerId("w1"), Incarnation(2), replacement.get());
  EXPECT_TRUE(IsLost(*coordinator_, "w1"));
  // Another host under the same process's name is refused.
  hello.set_worker_id("w0");
  hello.set_incarnation(1);
  hello.set_host("elsewhere");
  EXPECT_EQ(coordinator_->Attach(hello, std::make_shared<ClosableSink>()).status().code(),
            absl::StatusCode::kAlreadyExists);
}


TEST_F(CoordinatorTest, AWorkerThatLeavesIsNotCountedAsAFailure) {
  Attach("w0", 1);
  v1::WorkerMessage leave;
  leave.set_incarnation(1);
  leave.mutable_leave()->set_reason("shutting down");
  ASSERT_TRUE(coordinator_->OnWorkerMessage(WorkerId("w0"), leave).ok());
  auto workers = coordinator_->ListWorkers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(CounterValue(metrics_, "cohort_worker_departures_total"), 1);
  // The stream closing afterwards changes nothing.
  coordinator_->Detach(WorkerId("w0"), Incarnation(1));
  for (const auto& family : metrics_.registry()->Collect()) {
    if (family.name != "cohort_worker_failures_detected_total") continue;
    for (const auto& metric : family.metric) EXPECT_EQ(metric.counter.value, 0);
  }
}

// Value of cohort_checkpoint_failures_total{reason}; -1 if the series is missing.
double CheckpointFailures(const CoordinatorMetrics& metrics, const std::string& reason) {
  for (const auto& family : metrics.registry()->Collect()) {
    if (family.name != "cohort_checkpoint_failures_total") continue;
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        if (label.name == "reason" && label.value == reason) return metric.counter.value;
      }
    }
  }
  return -1;
}

// Issue 43: checkpoint failures reach the job's record, its watchers and the
// failure metric, whose every reason exists from the start.
TEST_F(CoordinatorTest, CheckpointFailuresAreCountedPublishedAndShownOnTheJob) {
  for (const char* reason : {"storage", "incomplete", "abandoned"}) {
    EXPECT_EQ(CheckpointFailures(metrics_, reason), 0) << reason;
  }
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallJobSpec("ckpt", 1, 1, 1);
  absl::StatusOr<v1::Job> job = coordinator_->Submit(request);
  ASSERT_TRUE(job.ok()) << job.status();
  const JobId id(job->job_id());
  auto watch = std::make_shared<RecordingWatch>();
  ASSERT_TRUE(coordinator_->Watch(id, watch).ok());

  v1::CheckpointFailure failure;
  failure.set_step(10);
  failure.set_generation(1);
  *failure.mutable_time() = ToProtoTime(clock_.Now());
  failure.set_kind(v1::CHECKPOINT_FAILURE_KIND_STORAGE);
  failure.set_reason("IO error: No space left on device");
  coordinator_->OnCheckpointFailed(id, failure);
  failure.set_kind(v1::CHECKPOINT_FAILURE_KIND_ABANDONED);
  coordinator_->OnCheckpointFailed(JobId("gone-1"), failure);  // counted, not recorded
  EXPECT_EQ(CheckpointFailures(metrics_, "storage"), 1);
  EXPECT_EQ(CheckpointFailures(metrics_, "abandoned"), 1);
  EXPECT_EQ(CheckpointFailures(metrics_, "incomplete"), 0);
  v1::CheckpointCommit commit;
  commit.set_step(20);
  commit.set_generation(1);
  *commit.mutable_time() = ToProtoTime(clock_.Now());
  coordinator_->OnCheckpointCommitted(id, commit);

  const v1::CheckpointStatus status = coordinator_->GetJob(id)->checkpoint_status();
  EXPECT_EQ(status.last_failure().reason(), "IO error: No space left on device");
  EXPECT_EQ(status.failed_attempts(), 1);
  EXPECT_EQ(status.last_commit().step(), 20);
  std::vector<v1::JobEvent> events = watch->events();
  ASSERT_EQ(events.size(), 3u);  // the snapshot, the failure, the commit
  EXPECT_EQ(events[1].kind(), v1::JOB_EVENT_KIND_CHECKPOINT);
  EXPECT_EQ(events[1].job().checkpoint_status().failed_attempts(), 1);
  EXPECT_FALSE(events[1].job().checkpoint_status().has_last_commit());
  EXPECT_EQ(events[2].kind(), v1::JOB_EVENT_KIND_CHECKPOINT);
  EXPECT_EQ(events[2].job().checkpoint_status().last_commit().step(), 20);
}

TEST_F(CoordinatorTest, KeyValueIsFencedByGeneration) {
  Attach("w0", 1);
  Attach("w1", 2);
  Attach("w2", 3);  // idle spare: replaces w1 below, forming generation 2
  v1::Job job = SubmitRunningJob();
  const KvScope current{JobId(job.job_id()), Generation(job.generation())};
  ASSERT_TRUE(coordinator_->KvSet(current, "ucx/0", "addr0").ok());
  EXPECT_EQ(*coordinator_->KvGet(current, "ucx/0"), "addr0");
  EXPECT_EQ(coordinator_->KvGet(current, "ucx/1").status().code(), absl::StatusCode::kNotFound);

  const KvScope future{JobId(job.job_id()), Generation(job.generation() + 1)};
  EXPECT_EQ(coordinator_->KvSet(future, "k", "v").code(), absl::StatusCode::kFailedPrecondition);
  const KvScope unknown{JobId("nope-9"), Generation(1)};
  EXPECT_EQ(coordinator_->KvSet(unknown, "k", "v").code(), absl::StatusCode::kNotFound);

  // A waiter on generation 1 is aborted when the job moves to generation 2.
  absl::StatusOr<std::string> waited = absl::UnknownError("not called");
  coordinator_->KvWaitFor(current, "ucx/1", absl::Seconds(30),
                          [&](absl::StatusOr<std::string> v) { waited = std::move(v); });
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kUnknown);  // still parked
  coordinator_->Detach(WorkerId("w1"), Incarnation(2));
  ASSERT_TRUE(Suspended("w0", 1, job).ok());
  ASSERT_EQ(coordinator_->GetJob(JobId(job.job_id()))->generation(), job.generation() + 1);
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(coordinator_->KvGet(current, "ucx/0").status().code(), absl::StatusCode::kAborted);
}

TEST_F(CoordinatorTest, WaitForCompletesOnSetOrTimesOutOnTheClock) {
  Attach("w0", 1);
  Attach("w1", 2);
  v1::Job job = SubmitRunningJob();
  const KvScope scope{JobId(job.job_id()), Generation(job.generation())};
  absl::StatusOr<std::string> got = absl::UnknownError("not called");
  coordinator_->KvWaitFor(scope, "id", absl::Seconds(5),
                          [&](absl::StatusOr<std::string> v) { got = std::move(v); });
  ASSERT_TRUE(coordinator_->KvSet(scope, "id", "nccl-unique-id").ok());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "nccl-unique-id");

  absl::StatusOr<std::string> timed_out = absl::UnknownError("not called");
  coordinator_->KvWaitFor(scope, "never", absl::Seconds(5),
                          [&](absl::StatusOr<std::string> v) { timed_out = std::move(v); });
  clock_.Advance(absl::Seconds(4));
  coordinator_->Tick();
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kUnknown);
  clock_.Advance(absl::Seconds(1));
  coordinator_->Tick();
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorTest, WatchStreamsSnapshotThenChangesUntilTheJobEnds) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallJobSpec("watched", 2, 2, 2);
  auto job = coordinator_->Submit(request);
  ASSERT_TRUE(job.ok());
  auto watch = std::make_shared<RecordingWatch>();
  ASSERT_TRUE(coordinator_->Watch(JobId(job->job_id()), watch).ok());
  Attach("w0", 1);
  Attach("w1", 2);
  ASSERT_TRUE(coordinator_->Cancel(JobId(job->job_id())).ok());
  auto events = watch->events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front().kind(), v1::JOB_EVENT_KIND_SNAPSHOT);
  EXPECT_EQ(events.front().job().state(), v1::JOB_STATE_PENDING);
  bool saw_mesh = false;
  for (const auto& e : events) saw_mesh |= e.kind() == v1::JOB_EVENT_KIND_MESH_CHANGED;
  EXPECT_TRUE(saw_mesh);
  EXPECT_EQ(events.back().job().state(), v1::JOB_STATE_CANCELLED);
  // The whole spec goes with the snapshot only; change events name it.
  EXPECT_TRUE(events.front().job().spec().has_model());
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_FALSE(events[i].job().spec().has_model()) << i;
    EXPECT_EQ(events[i].job().spec().name(), "watched") << i;
    EXPECT_EQ(events[i].job().spec().steps(), events.front().job().spec().steps()) << i;
  }
  EXPECT_TRUE(watch->finished());
  EXPECT_EQ(coordinator_->Watch(JobId("nope-1"), watch).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace cohort::coordinator
