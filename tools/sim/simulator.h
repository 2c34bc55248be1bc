#pragma once
// Simulator: many simulated workers (SimWorker streams) in one process,
// heartbeating against a real coordinator, to measure heartbeat round trips
// and the coordinator's CPU cost at scale.
//
// A run: open streams in batches until all are welcomed (or attach_timeout),
// heartbeat through the warmup, measure over `duration`, wait briefly for the
// window's last acks, then close every stream (WritesDone) and wait for the
// calls to finish. Streams are spread over several channels, each its own
// TCP connection. Not thread-safe: one thread calls Run.

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "common/tls_credentials.h"
#include "tools/sim/heartbeat_scheduler.h"
#include "tools/sim/measurement_window.h"
#include "tools/sim/sim_report.h"
#include "tools/sim/sim_worker.h"

namespace cohort::sim {

struct SimConfig {
  std::string coordinator;  // host:port
  ClientTlsFiles tls;       // as a worker's --tls_* flags
  int workers = 1000;
  double rate = 1;  // heartbeats per second per worker
  absl::Duration duration = absl::Seconds(20);
  absl::Duration warmup = absl::Seconds(3);
  int channels = 0;  // 0: one per kWorkersPerChannel workers
  int workers_per_host = 8;
  int attach_batch = 250;  // streams opened before waiting for their Welcomes
  absl::Duration attach_timeout = absl::Seconds(60);
  int timer_threads = 0;                 // 0: one per 2500 heartbeats/s, 1..4
  int queues = 0;  // completion queues (one thread each); 0: one per 1250 workers, 1..8
  std::optional<pid_t> coordinator_pid;  // measure its CPU over the window
  absl::Duration shutdown_timeout = absl::Seconds(10);
  // Prefix of worker ids ("sim-<i>") and hosts ("sim-host-<j>"); lets two
  // simulators share one coordinator.
  std::string name_prefix = "sim";
  // Called once every worker is attached (before the warmup), and after the
  // window's acks, before the streams close (e.g. to start and stop other
  // traffic, scrape the coordinator's metrics).
  std::function<void()> on_attached;
  std::function<void()> before_close;
};

class Simulator {
 public:
  static constexpr int kWorkersPerChannel = 250;
  static constexpr int kWorkersPerQueue = 1250;

  // Validates `config` (InvalidArgument with the offending field) and creates
  // the channels; connects nothing yet.
  static absl::StatusOr<std::unique_ptr<Simulator>> Create(SimConfig config);
  // Closes streams that are still open (bounded by shutdown_timeout).
  ~Simulator();

  // One full run. Errors: DeadlineExceeded if not every worker attached
  // within attach_timeout, Unavailable if the coordinator refused or dropped
  // streams while attaching (message carries the first stream's error).
  // Streams are closed before returning either way.
  absl::StatusOr<SimReport> Run();

  int channel_count() const { return static_cast<int>(stubs_.size()); }
  int queue_count() const { return static_cast<int>(queues_.size()); }

 private:
  explicit Simulator(SimConfig config) : config_(std::move(config)) {}

  absl::Status AttachAll(absl::Duration* attach_time);
  void Measure(SimReport* report);
  void WaitForWindowAcks();
  void CloseAll();
  // After CloseAll: ends the queues' threads (unless streams were abandoned).
  void StopQueues();
  std::string FirstError();

  const SimConfig config_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Workers::Stub>> stubs_;
  // Worker i's completions come on queues_[i % size], each drained by its
  // thread.
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues_;
  std::vector<std::thread> queue_threads_;
  // Heap-allocated so that streams abandoned by CloseAll can keep them.
  std::unique_ptr<MeasurementWindow> window_ = std::make_unique<MeasurementWindow>();
  std::unique_ptr<SimCounters> counters_ = std::make_unique<SimCounters>();
  std::vector<std::unique_ptr<SimWorker>> workers_;
  std::unique_ptr<HeartbeatScheduler> scheduler_;
  bool closed_ = false;
  bool abandoned_ = false;  // some streams never finished and were leaked
};

}  // namespace cohort::sim
