#pragma once
// LocalCluster: a real cohort-coordinator and real cohort-worker processes on
// loopback with free ports, plus gRPC stubs to inspect them. Every process is
// killed when the cluster is destroyed (Subprocess does that).

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cohort/v1/jobs.grpc.pb.h"
#include "common/grpc_status.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/testing/netns_hosts.h"
#include "tests/testing/testing.h"

namespace cohort::testing {

// Heartbeats fast enough to keep tests short; a broken stream is detected
// at once regardless.
inline constexpr char kHeartbeatInterval[] = "100ms";
inline constexpr char kHeartbeatTimeout[] = "1s";

class LocalCluster {
 public:
  explicit LocalCluster(std::string name)
      : dir_(MakeTempDir(name)), port_(PickFreePort()) {}

  // A cluster of several network stacks: the coordinator runs in host 0 of
  // `hosts` (before StartCoordinator) and workers in the hosts StartWorkerOn
  // names; the test reaches the coordinator through the bridge. `hosts`
  // must outlive the cluster.
  void UseHosts(NetnsHosts* hosts) { hosts_ = hosts; }

  // Starts (or restarts) the coordinator on the same port and data dir.
  // PickFreePort's port is free when picked, not reserved: a test running
  // beside this one may take it first. The first start therefore moves to a
  // fresh port when the coordinator reports that it cannot listen (a
  // restart must keep the port its workers know).
  void StartCoordinator(const std::string& readopt_grace = "10s",
                        const std::vector<std::string>& extra_args = {}) {
    const bool may_move = coordinator_starts_ == 0 && hosts_ == nullptr;
    for (int attempt = 0;; ++attempt) {
      const CoordinatorStart start = TryStartCoordinator(readopt_grace, extra_args);
      if (start == CoordinatorStart::kUp) return;
      if (start == CoordinatorStart::kPortTaken && may_move && attempt < 3) {
        port_ = PickFreePort();
        continue;
      }
      FAIL() << "coordinator did not come up; log:\n" << coordinator_->ReadLog();
    }
  }

  // Starts worker `id` on simulated host `host`.
  // Control-plane tests use the idle trainer (meshes without training);
  // training tests pass "engine".
  Subprocess* StartWorker(const std::string& id, const std::string& host, int device_index,
                          const std::string& trainer = "idle",
                          const std::vector<std::string>& extra_args = {}, int netns_host = -1) {
    Subprocess::Options options;
    options.binary = BinaryPath("cohort-worker");
    options.args = {absl::StrCat("--coordinator=", address()), absl::StrCat("--worker_id=", id),
                    absl::StrCat("--host=", host), "--device=cpu",
                    absl::StrCat("--device_index=", device_index),
                    "--metrics_address=127.0.0.1:0", "--trainer=" + trainer, "--threads=1"};
    options.args.insert(options.args.end(), extra_args.begin(), extra_args.end());
    if (netns_host >= 0) {
      std::tie(options.binary, options.args) =
          hosts_->Command(netns_host, options.binary, options.args);
    }
    options.log_path = absl::StrCat(dir_, "/", id, ".log");
    auto process = Subprocess::Start(options);
    EXPECT_TRUE(process.ok()) << process.status();
    if (!process.ok()) return nullptr;
    workers_processes_.push_back(*std::move(process));
    return workers_processes_.back().get();
  }

  // Starts worker `id` in host `host` of UseHosts's hosts, which it names
  // as its host ("host<i>") and announces its metrics on.
  Subprocess* StartWorkerOn(int host, const std::string& id, const std::string& trainer,
                            const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> args = {absl::StrCat("--metrics_address=", hosts_->address(host), ":0")};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return StartWorker(id, absl::StrCat("host", host), 0, trainer, args, host);
  }

  std::string address() const { return absl::StrCat(ip(), ":", port_); }
  // The coordinator's IP address.
  std::string ip() const { return hosts_ != nullptr ? hosts_->address(0) : "127.0.0.1"; }
  // The channel to the current coordinator (replaced by StartCoordinator).
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  const std::string& dir() const { return dir_; }
  Subprocess* coordinator() { return coordinator_.get(); }

  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    grpc::Status status = jobs_->Submit(&context, request, &job);
    if (!status.ok()) return FromGrpcStatus(status);
    return job;
  }

  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::Status status = jobs_->Get(&context, request, &job);
    if (!status.ok()) return FromGrpcStatus(status);
    return job;
  }

  absl::StatusOr<v1::Job> Cancel(const std::string& job_id) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::Status status = jobs_->Cancel(&context, request, &job);
    if (!status.ok()) return FromGrpcStatus(status);
    return job;
  }

  absl::StatusOr<v1::Job> Scale(const std::string& job_id, int min_workers, int max_workers) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ScaleJobRequest request;
    request.set_job_id(job_id);
    request.set_min_workers(min_workers);
    request.set_max_workers(max_workers);
    v1::Job job;
    grpc::Status status = jobs_->Scale(&context, request, &job);
    if (!status.ok()) return FromGrpcStatus(status);
    return job;
  }

  absl::StatusOr<v1::WorkerInfo> Drain(const std::string& worker_id, const std::string& reason) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::DrainWorkerRequest request;
    request.set_worker_id(worker_id);
    request.set_reason(reason);
    v1::WorkerInfo info;
    grpc::Status status = workers_->Drain(&context, request, &info);
    if (!status.ok()) return FromGrpcStatus(status);
    return info;
  }

  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListWorkersResponse response;
    grpc::Status status = workers_->List(&context, v1::ListWorkersRequest(), &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return std::vector<v1::WorkerInfo>(response.workers().begin(), response.workers().end());
  }

  // Workers in `state` right now.
  int CountWorkers(v1::WorkerState state) {
    auto workers = ListWorkers();
    if (!workers.ok()) return -1;
    int n = 0;
    for (const auto& w : *workers) n += w.state() == state;
    return n;
  }

  // Waits until `predicate(job)` holds; fails the test with the last job on timeout.
  template <typename Predicate>
  v1::Job WaitForJob(const std::string& job_id, Predicate predicate, absl::Duration timeout,
                     const std::string& what) {
    v1::Job last;
    bool ok = WaitUntil(
        [&] {
          auto job = GetJob(job_id);
          if (!job.ok()) return false;
          last = *job;
          return predicate(last);
        },
        timeout);
    EXPECT_TRUE(ok) << "timed out waiting for " << what << "; job is " << last.DebugString()
                    << "\ncoordinator log:\n"
                    << (coordinator_ ? coordinator_->ReadLog() : "");
    return last;
  }

  // Waits until `n` workers are attached and idle.
  void WaitForIdleWorkers(int n) {
    EXPECT_TRUE(WaitUntil([&] { return CountWorkers(v1::WORKER_STATE_IDLE) == n; },
                          absl::Seconds(30)))
        << "expected " << n << " idle workers; coordinator log:\n"
        << coordinator_->ReadLog();
  }

  static v1::JobSpec Spec(int tensor, int min_workers, int max_workers) {
    return SmallJobSpec("itest", tensor, min_workers, max_workers);
  }

  static bool RunningAndReady(const v1::Job& job, int workers) {
    return job.state() == v1::JOB_STATE_RUNNING && job.mesh().members_size() == workers &&
           job.ready_workers() == workers;
  }

 private:
  std::string dir_;
  int port_;

  enum class CoordinatorStart { kUp, kPortTaken, kFailed };
  // One start of the coordinator, and whether it came up within 30 s: an
  // early exit is seen at once (the connection is polled in slices while
  // the process runs).
  CoordinatorStart TryStartCoordinator(const std::string& readopt_grace,
                                       const std::vector<std::string>& extra_args) {
    Subprocess::Options options;
    options.binary = BinaryPath("cohort-coordinator");
    options.args = {absl::StrCat("--listen=", address()),
                    absl::StrCat("--metrics_address=", ip(), ":0"),
                    absl::StrCat("--data_dir=", dir_, "/data"),
                    absl::StrCat("--heartbeat_interval=", kHeartbeatInterval),
                    absl::StrCat("--heartbeat_timeout=", kHeartbeatTimeout),
                    absl::StrCat("--readopt_grace=", readopt_grace)};
    options.args.insert(options.args.end(), extra_args.begin(), extra_args.end());
    if (hosts_ != nullptr) {
      // Plaintext on the test's own bridge, which nothing else reaches.
      options.args.push_back("--allow_insecure");
      std::tie(options.binary, options.args) = hosts_->Command(0, options.binary, options.args);
    }
    options.log_path = absl::StrCat(dir_, "/coordinator-", coordinator_starts_++, ".log");
    auto process = Subprocess::Start(options);
    if (!process.ok()) {
      ADD_FAILURE() << process.status();
      return CoordinatorStart::kFailed;
    }
    coordinator_ = *std::move(process);
    channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::Jobs::NewStub(channel_);
    workers_ = v1::Workers::NewStub(channel_);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      if (channel_->WaitForConnected(std::chrono::system_clock::now() +
                                     std::chrono::milliseconds(200))) {
        return CoordinatorStart::kUp;
      }
      if (!coordinator_->Running()) {
        return absl::StrContains(coordinator_->ReadLog(), "cannot listen for gRPC")
                   ? CoordinatorStart::kPortTaken
                   : CoordinatorStart::kFailed;
      }
    }
    return CoordinatorStart::kFailed;
  }
  NetnsHosts* hosts_ = nullptr;
  int coordinator_starts_ = 0;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> workers_processes_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Jobs::Stub> jobs_;
  std::unique_ptr<v1::Workers::Stub> workers_;
};

}  // namespace cohort::testing
