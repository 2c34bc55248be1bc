// cohortctl end to end against fake Jobs and Workers services on an
// in-process gRPC server (127.0.0.1, port 0): output, exit codes, messages.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cohort/v1/jobs.grpc.pb.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "common/job_spec/io.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tools/cohortctl/cohortctl.h"
#include "tools/cohortctl/command_line.h"
#include "tools/cohortctl/spec_builder.h"

namespace cohort::cohortctl {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::Job MakeJob(const std::string& id, v1::JobState state, int64_t step) {
  v1::Job job;
  job.set_job_id(id);
  *job.mutable_spec() = DemoJobSpec();
  job.mutable_spec()->set_steps(200);  // the scripted progress below runs to step 200
  job.set_state(state);
  job.mutable_progress()->set_step(step);
  return job;
}

v1::JobEvent MakeEvent(v1::JobEventKind kind, const v1::Job& job) {
  v1::JobEvent event;
  event.set_kind(kind);
  *event.mutable_job() = job;
  return event;
}

// Jobs service with scripted answers. Thread-safe.
class FakeJobs final : public v1::Jobs::Service {
 public:
  grpc::Status Submit(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                      v1::Job* response) override {
    absl::MutexLock lock(&mu_);
    submits_.push_back(*request);
    if (!forced_.ok()) return forced_;
    if (request->spec().name().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "spec.name: must match [a-z0-9][a-z0-9-]{0,62}");
    }
    response->set_state(v1::JOB_STATE_PENDING);
    *response->mutable_spec() = request->spec();
    if (request->validate_only()) return grpc::Status::OK;
    response->set_job_id(absl::StrCat("j-", jobs_.size() + 1));
    response->set_message("waiting for workers");
    jobs_[response->job_id()] = *response;
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext*, const v1::GetJobRequest* request,
                   v1::Job* response) override {
    absl::MutexLock lock(&mu_);
    if (!forced_.ok()) return forced_;
    auto it = jobs_.find(request->job_id());
    if (it == jobs_.end()) return NotFound(request->job_id());
    *response = it->second;
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext*, const v1::ListJobsRequest* request,
                    v1::ListJobsResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (!forced_.ok()) return forced_;
    last_include_finished_ = request->include_finished();
    // One job per page, as a coordinator with page_size 1 would answer: the
    // client must follow next_page_token to see them all.
    ++list_calls_;
    bool past = request->page_token().empty();
    for (const auto& [id, job] : jobs_) {
      if (!past) {
        past = "jobs/" + id == request->page_token();
        continue;
      }
      if (response->jobs_size() == 1) {
        response->set_next_page_token("jobs/" + response->jobs(0).job_id());
        break;
      }
      *response->add_jobs() = job;
    }
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelJobRequest* request,
                      v1::Job* response) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request->job_id());
    if (it == jobs_.end()) return NotFound(request->job_id());
    it->second.set_state(v1::JOB_STATE_CANCELLED);
    it->second.clear_message();
    *response = it->second;
    return grpc::Status::OK;
  }

  grpc::Status Scale(grpc::ServerContext*, const v1::ScaleJobRequest* request,
                     v1::Job* response) override {
    absl::MutexLock lock(&mu_);
    scales_.push_back(*request);
    auto it = jobs_.find(request->job_id());
    if (it == jobs_.end()) return NotFound(request->job_id());
    it->second.mutable_spec()->mutable_elastic()->set_min_workers(request->min_workers());
    it->second.mutable_spec()->mutable_elastic()->set_max_workers(request->max_workers());
    *response = it->second;
    return grpc::Status::OK;
  }

  grpc::Status Watch(grpc::ServerContext*, const v1::WatchJobRequest* request,
                     grpc::ServerWriter<v1::JobEvent>* writer) override {
    std::vector<v1::JobEvent> events;
    grpc::Status end;
    {
      absl::MutexLock lock(&mu_);
      if (!jobs_.contains(request->job_id())) return NotFound(request->job_id());
      events = watch_events_;
      end = watch_end_;
    }
    for (const v1::JobEvent& event : events) {
      if (!writer->Write(event)) break;
    }
    return end;
  }

  void AddJob(const v1::Job& job) {
    absl::MutexLock lock(&mu_);
    jobs_[job.job_id()] = job;
  }
  void ScriptWatch(std::vector<v1::JobEvent> events, grpc::Status end = grpc::Status::OK) {
    absl::MutexLock lock(&mu_);
    watch_events_ = std::move(events);
    watch_end_ = std::move(end);
  }
  // Every later Submit, Get and List fails with `status`.
  void Force(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    forced_ = std::move(status);
  }
  std::vector<v1::SubmitJobRequest> submits() {
    absl::MutexLock lock(&mu_);
    return submits_;
  }
  std::vector<v1::ScaleJobRequest> scales() {
    absl::MutexLock lock(&mu_);
    return scales_;
  }
  bool last_include_finished() {
    absl::MutexLock lock(&mu_);
    return last_include_finished_;
  }
  size_t job_count() {
    absl::MutexLock lock(&mu_);
    return jobs_.size();
  }

 private:
  static grpc::Status NotFound(const std::string& id) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("job ", id, " not found"));
  }

  absl::Mutex mu_;
  std::map<std::string, v1::Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::JobEvent> watch_events_ ABSL_GUARDED_BY(mu_);
  grpc::Status watch_end_ ABSL_GUARDED_BY(mu_);
  grpc::Status forced_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::SubmitJobRequest> submits_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ScaleJobRequest> scales_ ABSL_GUARDED_BY(mu_);
  bool last_include_finished_ ABSL_GUARDED_BY(mu_) = false;
  int list_calls_ ABSL_GUARDED_BY(mu_) = 0;

 public:
  int list_calls() {
    absl::MutexLock lock(&mu_);
    return list_calls_;
  }
};

// Workers service over a fixed set; Drain answers as the coordinator does
// (NOT_FOUND unknown, FAILED_PRECONDITION lost, else DRAINING). Thread-safe.
class FakeWorkers final : public v1::Workers::Service {
 public:
  explicit FakeWorkers(v1::ListWorkersResponse workers) : workers_(std::move(workers)) {}
  grpc::Status List(grpc::ServerContext*, const v1::ListWorkersRequest*,
                    v1::ListWorkersResponse* response) override {
    absl::MutexLock lock(&mu_);
    *response = workers_;
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext*, const v1::DrainWorkerRequest* request,
                     v1::WorkerInfo* response) override {
    absl::MutexLock lock(&mu_);
    drains_.push_back(*request);
    for (v1::WorkerInfo& worker : *workers_.mutable_workers()) {
      if (worker.worker_id() != request->worker_id()) continue;
      if (worker.state() == v1::WORKER_STATE_LOST) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("worker ", worker.worker_id(), " is lost"));
      }
      worker.set_state(v1::WORKER_STATE_DRAINING);
      *response = worker;
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("worker ", request->worker_id(), " is not attached"));
  }

  std::vector<v1::DrainWorkerRequest> drains() {
    absl::MutexLock lock(&mu_);
    return drains_;
  }

 private:
  absl::Mutex mu_;
  v1::ListWorkersResponse workers_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::DrainWorkerRequest> drains_ ABSL_GUARDED_BY(mu_);
};

v1::ListWorkersResponse TwoWorkers() {
  v1::ListWorkersResponse response;
  v1::WorkerInfo& w0 = *response.add_workers();
  w0.set_worker_id("w0");
  w0.set_host("host-a");
  w0.set_state(v1::WORKER_STATE_ASSIGNED);
  w0.set_job_id("j-1");
  w0.mutable_coordinates()->set_rank(1);
  w0.set_last_heartbeat_age_ms(300);
  v1::WorkerInfo& w1 = *response.add_workers();
  w1.set_worker_id("w1");
  w1.set_host("host-b");
  w1.set_state(v1::WORKER_STATE_IDLE);
  v1::WorkerInfo& w2 = *response.add_workers();
  w2.set_worker_id("w2");
  w2.set_host("host-c");
  w2.set_state(v1::WORKER_STATE_LOST);
  return response;
}

const std::string kDemoYaml = std::string(COHORT_SOURCE_DIR) + "/deploy/local/jobs/demo.yaml";

class CohortctlTest : public ::testing::Test {
 protected:
  CohortctlTest() : workers_(TwoWorkers()) {}

  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&workers_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  void TearDown() override {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }

  // Runs cohortctl with `args` against the fake server.
  // Runs cohortctl with `args` and config_ against the fake server. (Tests
  // edit config_ in place: copying a CtlConfig trips a GCC 12
  // maybe-uninitialized false positive on its optional strings.)
  int Run(std::vector<std::string> args) {
    config_.coordinator = absl::StrCat("127.0.0.1:", port_);
    config_.timeout = absl::Seconds(10);
    config_.args = std::move(args);
    out_.str("");
    err_.str("");
    return RunCohortctl(config_, out_, err_);
  }

  std::string out() const { return out_.str(); }
  std::string err() const { return err_.str(); }

  CtlConfig config_;
  FakeJobs jobs_;
  FakeWorkers workers_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(CohortctlTest, SubmitFilePrintsJobIdAndState) {
  EXPECT_EQ(Run({"submit", kDemoYaml}), kExitOk) << err();
  EXPECT_EQ(out(), "j-1 PENDING (waiting for workers)\n");
  EXPECT_EQ(err(), "");
  ASSERT_EQ(jobs_.submits().size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(jobs_.submits()[0].spec(), DemoJobSpec()));
  EXPECT_FALSE(jobs_.submits()[0].validate_only());
}

TEST_F(CohortctlTest, SubmitFlagsOverrideTheFile) {
  config_.spec = {{"name", "wide"}, {"tensor", "4"}};
  EXPECT_EQ(Run({"submit", kDemoYaml}), kExitOk) << err();
  ASSERT_EQ(jobs_.submits().size(), 1u);
  EXPECT_EQ(jobs_.submits()[0].spec().name(), "wide");
  EXPECT_EQ(jobs_.submits()[0].spec().parallelism().tensor(), 4);
  EXPECT_EQ(jobs_.submits()[0].spec().model().layers(), 2);
}

TEST_F(CohortctlTest, SubmitValidateOnlyCreatesNothing) {
  config_.validate_only = true;
  EXPECT_EQ(Run({"submit", kDemoYaml}), kExitOk) << err();
  EXPECT_EQ(out(), "job spec \"demo\" is valid\n");
  ASSERT_EQ(jobs_.submits().size(), 1u);
  EXPECT_TRUE(jobs_.submits()[0].validate_only());
  EXPECT_EQ(jobs_.job_count(), 0u);
}

TEST_F(CohortctlTest, SubmitRefusedShowsTheServersFieldMessage) {
  config_.spec = {{"name", ""}};
  EXPECT_EQ(Run({"submit", kDemoYaml}), kExitFailure);
  EXPECT_EQ(out(), "");
  EXPECT_EQ(err(),
            "cohortctl: submit: INVALID_ARGUMENT: spec.name: must match "
            "[a-z0-9][a-z0-9-]{0,62}\n");
}

TEST_F(CohortctlTest, SubmitBadFileFailsBeforeAnyCall) {
  const std::string path = ::testing::TempDir() + "/cohortctl_bad.yaml";
  { std::ofstream(path) << "name: demo\nmodel:\n  layerz: 2\n"; }
  EXPECT_EQ(Run({"submit", path}), kExitFailure);
  EXPECT_THAT(err(), StartsWith(absl::StrCat("cohortctl: ", path,
                                             ": line 3, column 3: unknown "
                                             "field \"layerz\"")));
  EXPECT_THAT(err(), EndsWith("\n"));
  EXPECT_TRUE(jobs_.submits().empty());
}

TEST_F(CohortctlTest, SubmitJsonOutputIsTheJob) {
  config_.output = OutputFormat::kJson;
  EXPECT_EQ(Run({"submit", kDemoYaml}), kExitOk) << err();
  absl::StatusOr<v1::Job> job = [&]() -> absl::StatusOr<v1::Job> {
    v1::Job parsed;
    absl::Status s = ParseMessage(out(), JobSpecFormat::kJson, &parsed);
    if (!s.ok()) return s;
    return parsed;
  }();
  ASSERT_TRUE(job.ok()) << job.status() << "\n" << out();
  EXPECT_EQ(job->job_id(), "j-1");
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING);
}

TEST_F(CohortctlTest, GetUnknownJobIsNotFound) {
  EXPECT_EQ(Run({"get", "j-9"}), kExitFailure);
  EXPECT_EQ(out(), "");
  EXPECT_EQ(err(), "cohortctl: get: NOT_FOUND: job j-9 not found\n");
}

TEST_F(CohortctlTest, GetShowsDetails) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 20));
  EXPECT_EQ(Run({"get", "j-5"}), kExitOk) << err();
  EXPECT_THAT(out(), StartsWith("Job:         j-5\nName:        demo\n"
                                "State:       RUNNING\n"));
  EXPECT_THAT(out(), HasSubstr("step 20/200"));
}

TEST_F(CohortctlTest, ListTableAndAllFlag) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 20));
  EXPECT_EQ(Run({"list"}), kExitOk) << err();
  EXPECT_FALSE(jobs_.last_include_finished());
  const std::vector<std::string> lines = absl::StrSplit(out(), '\n');
  ASSERT_EQ(lines.size(), 3u);  // header, one job, empty after the last '\n'
  EXPECT_THAT(lines[0], StartsWith("JOB  NAME  STATE    GEN  WORKERS  MESH"));
  EXPECT_THAT(lines[1], StartsWith("j-5  demo  RUNNING  0    0        -"));

  config_.all = true;
  EXPECT_EQ(Run({"list"}), kExitOk) << err();
  EXPECT_TRUE(jobs_.last_include_finished());
}

TEST_F(CohortctlTest, ListFollowsEveryPage) {
  for (int i = 1; i <= 3; ++i) jobs_.AddJob(MakeJob(absl::StrCat("j-", i), v1::JOB_STATE_RUNNING, 20));
  EXPECT_EQ(Run({"list"}), kExitOk) << err();
  EXPECT_EQ(jobs_.list_calls(), 3);  // one job per page
  for (const char* id : {"j-1  ", "j-2  ", "j-3  "}) EXPECT_THAT(out(), HasSubstr(id));
}

TEST_F(CohortctlTest, ListJsonParsesBack) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 20));
  config_.output = OutputFormat::kJson;
  EXPECT_EQ(Run({"list"}), kExitOk) << err();
  v1::ListJobsResponse parsed;
  ASSERT_TRUE(ParseMessage(out(), JobSpecFormat::kJson, &parsed).ok()) << out();
  ASSERT_EQ(parsed.jobs_size(), 1);
  EXPECT_EQ(parsed.jobs(0).job_id(), "j-5");
  EXPECT_EQ(parsed.jobs(0).progress().step(), 20);
}

TEST_F(CohortctlTest, CancelPrintsTheNewState) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 20));
  EXPECT_EQ(Run({"cancel", "j-5"}), kExitOk) << err();
  EXPECT_EQ(out(), "j-5 CANCELLED\n");
  EXPECT_EQ(Run({"cancel", "j-6"}), kExitFailure);
  EXPECT_EQ(err(), "cohortctl: cancel: NOT_FOUND: job j-6 not found\n");
}

TEST_F(CohortctlTest, ScaleSendsTheBounds) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 20));
  config_.spec = {{"min_workers", "3"}};
  EXPECT_EQ(Run({"scale", "j-5"}), kExitOk) << err();
  config_.spec.emplace_back("max_workers", "6");
  EXPECT_EQ(Run({"scale", "j-5"}), kExitOk) << err();
  EXPECT_EQ(out(), "j-5 RUNNING\n");
  const std::vector<v1::ScaleJobRequest> scales = jobs_.scales();
  ASSERT_EQ(scales.size(), 2u);
  EXPECT_EQ(scales[0].job_id(), "j-5");
  EXPECT_EQ(scales[0].min_workers(), 3);
  EXPECT_EQ(scales[0].max_workers(), 3);  // --max_workers defaults to --min_workers
  EXPECT_EQ(scales[1].min_workers(), 3);
  EXPECT_EQ(scales[1].max_workers(), 6);
}

TEST_F(CohortctlTest, WorkersTable) {
  EXPECT_EQ(Run({"workers"}), kExitOk) << err();
  EXPECT_EQ(out(),
            "WORKER  HOST    DEVICE  STATE     JOB  RANK  SPARE  HEARTBEAT AGE  METRICS\n"
            "w0      host-a  cpu:0   ASSIGNED  j-1  1     -      300ms          -\n"
            "w1      host-b  cpu:0   IDLE      -    -     -      0ms            -\n"
            "w2      host-c  cpu:0   LOST      -    -     -      0ms            -\n");
}

TEST_F(CohortctlTest, ScaleWorkersSetsBothBounds) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 20));
  config_.workers = 4;
  EXPECT_EQ(Run({"scale", "j-5"}), kExitOk) << err();
  EXPECT_EQ(out(), "j-5 RUNNING\n");
  const std::vector<v1::ScaleJobRequest> scales = jobs_.scales();
  ASSERT_EQ(scales.size(), 1u);
  EXPECT_EQ(scales[0].min_workers(), 4);
  EXPECT_EQ(scales[0].max_workers(), 4);

  config_.spec.emplace_back("max_workers", "6");
  EXPECT_EQ(Run({"scale", "j-5"}), kExitUsage);
  EXPECT_THAT(err(), StartsWith("cohortctl: scale: --workers cannot be combined with "
                                "--max_workers (--workers=N sets both bounds)\n\n"));
  EXPECT_EQ(jobs_.scales().size(), 1u);
}

TEST_F(CohortctlTest, DrainPrintsTheWorkersNewState) {
  config_.reason.emplace("replace its disk");
  EXPECT_EQ(Run({"drain", "w0"}), kExitOk) << err();
  EXPECT_EQ(out(),
            "worker w0: DRAINING (its job j-1 is re-planned without it; it exits once its state "
            "is handed over)\n");
  EXPECT_EQ(err(), "");
  config_.reason.reset();
  EXPECT_EQ(Run({"drain", "w1"}), kExitOk) << err();
  EXPECT_EQ(out(), "worker w1: DRAINING (in no job; it exits now)\n");
  const std::vector<v1::DrainWorkerRequest> drains = workers_.drains();
  ASSERT_EQ(drains.size(), 2u);
  EXPECT_EQ(drains[0].worker_id(), "w0");
  EXPECT_EQ(drains[0].reason(), "replace its disk");
  EXPECT_EQ(drains[1].worker_id(), "w1");
  EXPECT_EQ(drains[1].reason(), "");
}

TEST_F(CohortctlTest, DrainRefusedExitsOne) {
  EXPECT_EQ(Run({"drain", "w9"}), kExitFailure);
  EXPECT_EQ(out(), "");
  EXPECT_EQ(err(), "cohortctl: drain: NOT_FOUND: worker w9 is not attached\n");
  EXPECT_EQ(Run({"drain", "w2"}), kExitFailure);
  EXPECT_EQ(err(), "cohortctl: drain: FAILED_PRECONDITION: worker w2 is lost\n");
}

TEST_F(CohortctlTest, DrainJsonIsTheWorkerInfo) {
  config_.output = OutputFormat::kJson;
  EXPECT_EQ(Run({"drain", "w0"}), kExitOk) << err();
  v1::WorkerInfo parsed;
  ASSERT_TRUE(ParseMessage(out(), JobSpecFormat::kJson, &parsed).ok()) << out();
  EXPECT_EQ(parsed.worker_id(), "w0");
  EXPECT_EQ(parsed.state(), v1::WORKER_STATE_DRAINING);
}

TEST_F(CohortctlTest, DrainWithoutAWorkerIsAUsageError) {
  EXPECT_EQ(Run({"drain"}), kExitUsage);
  EXPECT_THAT(err(), StartsWith("cohortctl: drain needs a WORKER operand\n\n"));
  EXPECT_TRUE(workers_.drains().empty());
}

v1::Job PeerRecovered(v1::Job job) {
  job.set_generation(3);
  v1::RecoveryPlan& plan = *job.mutable_recovery();
  plan.set_kind(v1::RECOVERY_KIND_PEER);
  plan.set_step(120);
  plan.set_source_generation(2);
  plan.set_reason("every piece survives");
  job.mutable_recovery_stats()->set_peer(1);
  job.mutable_recovery_stats()->set_last_detect_to_running_seconds(0.184);
  return job;
}

TEST_F(CohortctlTest, GetShowsRecovery) {
  jobs_.AddJob(PeerRecovered(MakeJob("j-5", v1::JOB_STATE_RUNNING, 120)));
  EXPECT_EQ(Run({"get", "j-5"}), kExitOk) << err();
  EXPECT_THAT(out(), HasSubstr("Recovery:    PEER at step 120 (generation 3 from generation 2's "
                               "memory, 0 steps lost): every piece survives\n"
                               "Recoveries:  1 peer, 0 from checkpoint, 0 steps lost; last took "
                               "0.184 s from detection to running (suspend 0.000 s, prepare "
                               "0.000 s)\n"));
}

// A run that loses a worker at step 100 and recovers from peers at step 120.
std::vector<v1::JobEvent> RunWithARecovery() {
  v1::Job job = MakeJob("j-5", v1::JOB_STATE_RUNNING, 0);
  std::vector<v1::JobEvent> events;
  events.push_back(MakeEvent(v1::JOB_EVENT_KIND_SNAPSHOT, job));
  job.mutable_progress()->set_step(120);
  events.push_back(MakeEvent(v1::JOB_EVENT_KIND_PROGRESS, job));
  job = PeerRecovered(job);
  events.push_back(MakeEvent(v1::JOB_EVENT_KIND_RECOVERED, job));
  job.mutable_progress()->set_step(200);
  job.set_state(v1::JOB_STATE_COMPLETED);
  events.push_back(MakeEvent(v1::JOB_EVENT_KIND_STATE_CHANGED, job));
  return events;
}

TEST_F(CohortctlTest, WatchPrintsRecoveredEvents) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch(RunWithARecovery());
  EXPECT_EQ(Run({"watch", "j-5"}), kExitOk) << err();
  const std::vector<std::string> lines = absl::StrSplit(out(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u) << out();
  EXPECT_EQ(lines[2],
            "- RECOVERED job=j-5 generation 3: PEER at step 120, 0 steps lost, 0.184 s from "
            "detection to running");
}

TEST_F(CohortctlTest, WatchOnATerminalPrintsRecoveredAboveTheBar) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch(RunWithARecovery());
  config_.stdout_is_terminal = true;
  config_.terminal_width = 100;
  EXPECT_EQ(Run({"watch", "j-5"}), kExitOk) << err();
  // Erase the bar, print the line, then redraw the bar below it.
  EXPECT_THAT(out(), HasSubstr("\r\x1b[K- RECOVERED job=j-5 generation 3: PEER at step 120, 0 "
                               "steps lost, 0.184 s from detection to running\n\r["));
}

std::vector<v1::JobEvent> RunToEnd(v1::JobState end) {
  v1::Job job = MakeJob("j-5", v1::JOB_STATE_RUNNING, 0);
  std::vector<v1::JobEvent> events;
  events.push_back(MakeEvent(v1::JOB_EVENT_KIND_SNAPSHOT, job));
  job.mutable_progress()->set_step(100);
  events.push_back(MakeEvent(v1::JOB_EVENT_KIND_PROGRESS, job));
  job.set_state(end);
  job.mutable_progress()->set_step(end == v1::JOB_STATE_COMPLETED ? 200 : 150);
  if (end == v1::JOB_STATE_FAILED) job.set_message("worker w1 lost");
  events.push_back(MakeEvent(v1::JOB_EVENT_KIND_STATE_CHANGED, job));
  // Never read: watch stops at the terminal state.
  events.push_back(MakeEvent(v1::JOB_EVENT_KIND_PROGRESS, job));
  return events;
}

TEST_F(CohortctlTest, WatchPrintsALinePerEventAndExitsZeroOnCompletion) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch(RunToEnd(v1::JOB_STATE_COMPLETED));
  EXPECT_EQ(Run({"watch", "j-5"}), kExitOk) << err();
  const std::vector<std::string> lines = absl::StrSplit(out(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << out();
  EXPECT_THAT(lines[0], StartsWith("- SNAPSHOT job=j-5 state=RUNNING"));
  EXPECT_THAT(lines[1], HasSubstr("PROGRESS job=j-5 state=RUNNING gen=0 "
                                  "step=100/200"));
  EXPECT_THAT(lines[2], HasSubstr("STATE_CHANGED job=j-5 state=COMPLETED"));
  EXPECT_EQ(lines[3], "job j-5 COMPLETED at step 200/200");
  EXPECT_EQ(out().find('\r'), std::string::npos);
}

TEST_F(CohortctlTest, WatchExitsOneWhenTheJobFails) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch(RunToEnd(v1::JOB_STATE_FAILED));
  EXPECT_EQ(Run({"watch", "j-5"}), kExitFailure);
  EXPECT_THAT(out(), EndsWith("job j-5 FAILED at step 150/200: worker w1 lost\n"));
}

TEST_F(CohortctlTest, WatchExitsOneWhenTheJobIsCancelled) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch(RunToEnd(v1::JOB_STATE_CANCELLED));
  EXPECT_EQ(Run({"watch", "j-5"}), kExitFailure);
  EXPECT_THAT(out(), EndsWith("job j-5 CANCELLED at step 150/200\n"));
}

TEST_F(CohortctlTest, WatchOnATerminalRedrawsOneLine) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch(RunToEnd(v1::JOB_STATE_COMPLETED));
  config_.stdout_is_terminal = true;
  config_.terminal_width = 100;
  EXPECT_EQ(Run({"watch", "j-5"}), kExitOk) << err();
  const std::string text = out();
  // Snapshot and progress redraw the bar in place: no newline between them.
  EXPECT_THAT(text, StartsWith("\r[....."));
  const size_t second = text.find("\r[####", 1);
  ASSERT_NE(second, std::string::npos) << text;
  EXPECT_EQ(text.substr(0, second).find('\n'), std::string::npos);
  // The state change is printed as a line above the final bar.
  EXPECT_THAT(text, HasSubstr("\r\x1b[K- STATE_CHANGED job=j-5 state=COMPLETED"));
  EXPECT_THAT(text, HasSubstr("200/200 100%"));
  EXPECT_THAT(text, EndsWith("\x1b[K\njob j-5 COMPLETED at step 200/200\n"));
}

TEST_F(CohortctlTest, WatchJsonPrintsOneObjectPerLine) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch(RunToEnd(v1::JOB_STATE_COMPLETED));
  config_.output = OutputFormat::kJson;
  config_.stdout_is_terminal = true;  // json wins over the progress bar
  EXPECT_EQ(Run({"watch", "j-5"}), kExitOk) << err();
  const std::vector<std::string> lines = absl::StrSplit(out(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << out();
  for (const std::string& line : lines) {
    v1::JobEvent event;
    ASSERT_TRUE(ParseMessage(line, JobSpecFormat::kJson, &event).ok()) << line;
    EXPECT_EQ(event.job().job_id(), "j-5");
  }
  v1::JobEvent last;
  ASSERT_TRUE(ParseMessage(lines[2], JobSpecFormat::kJson, &last).ok());
  EXPECT_EQ(last.job().state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(CohortctlTest, WatchStreamEndingEarlyIsAFailure) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch(
      {MakeEvent(v1::JOB_EVENT_KIND_SNAPSHOT, MakeJob("j-5", v1::JOB_STATE_RUNNING, 0))});
  EXPECT_EQ(Run({"watch", "j-5"}), kExitFailure);
  EXPECT_EQ(err(), "cohortctl: watch: the stream ended before the job finished\n");
}

TEST_F(CohortctlTest, WatchStreamErrorIsReported) {
  jobs_.AddJob(MakeJob("j-5", v1::JOB_STATE_RUNNING, 0));
  jobs_.ScriptWatch({}, grpc::Status(grpc::StatusCode::INTERNAL, "boom"));
  EXPECT_EQ(Run({"watch", "j-5"}), kExitFailure);
  EXPECT_EQ(err(), "cohortctl: watch: INTERNAL: boom\n");
}

TEST_F(CohortctlTest, WatchUnknownJobIsNotFound) {
  EXPECT_EQ(Run({"watch", "j-9"}), kExitFailure);
  EXPECT_EQ(err(), "cohortctl: watch: NOT_FOUND: job j-9 not found\n");
}

TEST_F(CohortctlTest, ServerSideUnavailableIsAnRpcErrorNotUnreachable) {
  jobs_.Force(grpc::Status(grpc::StatusCode::UNAVAILABLE, "recovering state"));
  EXPECT_EQ(Run({"list"}), kExitFailure);
  EXPECT_EQ(err(), "cohortctl: list: UNAVAILABLE: recovering state\n");
  jobs_.Force(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow store"));
  EXPECT_EQ(Run({"get", "j-1"}), kExitFailure);
  EXPECT_EQ(err(), "cohortctl: get: DEADLINE_EXCEEDED: slow store\n");
}

TEST_F(CohortctlTest, UsageErrorsAndHelpNeedNoServer) {
  EXPECT_EQ(Run({"frobnicate"}), kExitUsage);
  EXPECT_THAT(err(), StartsWith("cohortctl: unknown command \"frobnicate\"\n\n"));
  EXPECT_THAT(err(), HasSubstr(UsageText()));
  EXPECT_EQ(Run({"help"}), kExitOk);
  EXPECT_EQ(out(), UsageText());
}

// A port on 127.0.0.1 that refuses connections for as long as the returned
// socket stays open: bound, never listening.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      return;
    }
    socklen_t length = sizeof(address);
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port_ = ntohs(address.sin_port);
    }
  }
  ~RefusingPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(CohortctlUnreachableTest, NoServerListeningExitsTwoQuickly) {
  RefusingPort refusing;
  ASSERT_GT(refusing.port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", refusing.port());
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"list"}, {"get", "j-1"}, {"watch", "j-1"}, {"workers"}, {"drain", "w1"}}) {
    CtlConfig config;
    config.coordinator = address;
    config.timeout = absl::Seconds(20);
    config.args = args;
    std::ostringstream out;
    std::ostringstream err;
    const absl::Time start = absl::Now();
    EXPECT_EQ(RunCohortctl(config, out, err), kExitUnreachable) << args[0];
    // A refused connection fails at once, not after the timeout.
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << args[0];
    const std::string message = err.str();
    EXPECT_THAT(message, StartsWith(absl::StrCat("cohortctl: cannot reach the coordinator at ",
                                                 address, " (")))
        << args[0];
    EXPECT_THAT(message, EndsWith(")\n")) << args[0];
    EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 1) << message;
    EXPECT_EQ(out.str(), "") << args[0];
  }
}

}  // namespace
}  // namespace cohort::cohortctl
