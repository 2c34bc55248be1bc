#pragma once
// ChurnDriver: the job traffic of a busy cluster, against the coordinator
// cohort-sim's workers heartbeat to (issue 22's scale run): jobs submitted
// and cancelled at a steady rate, jobs that re-plan over and over (scaled
// between two worker counts as soon as each re-plan has settled), and one
// probe job of many workers, timed from Submit to RUNNING. Each activity
// runs on its own thread with its own channel; every call has a deadline.
// Not thread-safe: one thread calls Start and Stop.

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cohort/v1/jobs.grpc.pb.h"
#include "cohort/v1/jobs.pb.h"
#include "common/tls_credentials.h"

namespace cohort::sim {

struct ChurnConfig {
  std::string coordinator;
  ClientTlsFiles tls;
  // Jobs of one worker submitted per second; once more than `live_jobs`
  // are running, the oldest is cancelled for each new one.
  double submits_per_second = 0;
  int live_jobs = 20;
  // Jobs scaled between 2 and 4 workers, each `replan_pause` after its last
  // re-plan reached RUNNING (0: at once; simulated workers answer at once,
  // so that is hundreds of re-plans a second).
  int replanning_jobs = 0;
  absl::Duration replan_pause = absl::Seconds(1);
  // A job of this many workers (0: none), submitted once the others run.
  int probe_workers = 0;
  std::string name_prefix = "churn";
};

struct ChurnReport {
  int64_t submitted = 0;
  int64_t cancelled = 0;
  int64_t replans = 0;        // scale calls whose re-plan reached RUNNING
  int64_t call_errors = 0;    // RPCs that failed (each is logged)
  std::optional<double> probe_seconds;  // Submit to RUNNING of the probe job
  std::string first_error;
};

class ChurnDriver {
 public:
  static absl::StatusOr<std::unique_ptr<ChurnDriver>> Create(ChurnConfig config);
  ~ChurnDriver();
  void Start();
  // Stops the threads (bounded by the call deadlines), cancels the jobs it
  // made, and reports.
  ChurnReport Stop();

  // The spec of a simulated job of `workers` workers (a tiny synthetic model
  // whose micro-batch count every data-parallel degree up to `workers`
  // divides), named `name`.
  static v1::JobSpec SimJobSpec(const std::string& name, int min_workers, int max_workers);

 private:
  explicit ChurnDriver(ChurnConfig config) : config_(std::move(config)) {}
  void SubmitLoop();
  void ReplanLoop(int index);
  void Probe();
  // Submit/Cancel/Scale/Get with a deadline; errors counted.
  std::optional<v1::Job> Submit(const v1::JobSpec& spec);
  bool Cancel(const std::string& job_id);
  std::optional<v1::Job> Get(const std::string& job_id);
  bool Scale(const std::string& job_id, int workers);
  // Polls until the job is RUNNING at a generation above `after` (or the
  // deadline, or Stop); true when it is.
  bool WaitRunning(const std::string& job_id, uint64_t after, absl::Duration timeout);
  void Error(const std::string& what, const absl::Status& status);

  const ChurnConfig config_;
  std::unique_ptr<v1::Jobs::Stub> stub_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> submitted_{0}, cancelled_{0}, replans_{0}, errors_{0};
  std::atomic<double> probe_seconds_{-1};
  absl::Mutex mu_;
  std::set<std::string> made_ ABSL_GUARDED_BY(mu_);  // jobs not yet cancelled, for Stop
  std::string first_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::sim
