#pragma once
// WorkerDaemon: one cohort-worker process. Discovers (and for a GPU,
// self-tests) its device, serves /metrics, and runs the WorkerAgent against
// the coordinator with the trainer.

#include <memory>
#include <string>

#include "worker/compute/backend_factory.h"
#include "absl/status/statusor.h"
#include "cohort/v1/job.pb.h"
#include "common/ids.h"
#include "common/metrics_server.h"
#include "common/tls_credentials.h"
#include "worker/agent/agent.h"
#include "worker/agent/backoff.h"
#include "worker/agent/idle_trainer.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/device/device_info.h"

namespace cohort::worker {

// Built by main.cc from flags; see the flag help strings there.
struct WorkerConfig {
  std::string coordinator = "localhost:7070";  // gRPC target host:port
  ClientTlsFiles tls;  // --tls_ca, --tls_cert, --tls_key, --tls_server_name
  std::string worker_id;  // empty: DefaultWorkerId(host, device_kind, device_index)
  std::string host;       // empty: this machine's hostname
  v1::DeviceKind device_kind = v1::DEVICE_KIND_CPU;
  int device_index = 0;
  std::string metrics_address = "127.0.0.1:0";  // port 0: any free port
  BackoffOptions backoff;
  // "engine": train assigned jobs (EngineTrainer). "idle": join meshes and
  // follow commands without training (control-plane tests and drills).
  std::string trainer = "engine";
  int threads = 0;  // compute threads; 0 = all cores
  std::string loss_log;  // EngineTrainerOptions::loss_log
  // EngineTrainerOptions::warm_memory_bytes; -1: a quarter of the device's memory.
  int64_t warm_spare_memory_bytes = -1;
  int checkpoint_load_streams = 4;  // EngineTrainerOptions::checkpoint_load_streams
  absl::Duration collective_timeout = absl::Seconds(60);  // EngineTrainerOptions::collective_timeout
  // EngineTrainerOptions::collective_watchdog_grace
  absl::Duration collective_watchdog_grace = absl::Seconds(10);
  // --ucx_net_devices: "auto", "all" or UCX's own list (comm::ResolveNetDevices).
  std::string ucx_net_devices = "auto";
  comm::CollectiveAlgorithm collectives = comm::CollectiveAlgorithm::kAuto;  // --collectives
  compute::FusedAttention fused_attention = compute::FusedAttention::kAuto;  // --fused_attention
  compute::CudaGraphs cuda_graphs = compute::CudaGraphs::kAuto;              // --cuda_graphs
};

// "<host>-<cpu|gpu>-<index>".
std::string DefaultWorkerId(const std::string& host, v1::DeviceKind kind, int index);

// Thread-safe: Run() from one thread, Shutdown() from any.
class WorkerDaemon {
 public:
  // Fails with the device discovery errors (device_discovery.h: Unimplemented
  // for a GPU in a build without CUDA, FailedPrecondition without a usable
  // GPU, Internal for a failed self-test) or Unavailable when the metrics
  // address cannot be bound. Nothing is contacted yet.
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Create(const WorkerConfig& config);

  // Stops training before the agent (which the trainer reports to) goes.
  ~WorkerDaemon() {
    if (trainer_ != nullptr) trainer_->Stop();
  }

  // Runs the agent until Drain or Shutdown; OK in both cases.
  absl::Status Run() { return agent_->Run(); }
  void Shutdown() { agent_->Shutdown(); }

  const DeviceInfo& device() const { return device_; }
  const std::string& metrics_address() const { return metrics_server_->address(); }
  Incarnation incarnation() const { return incarnation_; }
  const WorkerAgent& agent() const { return *agent_; }

 private:
  WorkerDaemon() = default;

  DeviceInfo device_;
  Incarnation incarnation_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<WorkerAgent> agent_;  // declared last: destroyed first
};

}  // namespace cohort::worker
