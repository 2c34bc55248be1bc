#pragma once
// CoordinatorServer: assembles the coordinator process: RocksDB state, the
// Coordinator logic, gRPC services (with health checking and reflection),
// the /metrics endpoint and the ticker thread that drives failure detection.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/message_limits.h"
#include "common/metrics_server.h"
#include "common/tls_credentials.h"
#include "coordinator/checkpoints/checkpoint_uploads.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service/blocking_executor.h"
#include "coordinator/service/call_gate.h"
#include "coordinator/service/checkpoints_service.h"
#include "coordinator/store/rocksdb_checkpoint_store.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace cohort::coordinator {

// gRPC's resource quota by default (--grpc_memory_bytes). As it fills,
// gRPC shrinks flow-control windows and then cancels streams, any stream:
// with 32 MiB a checkpoint save after a restore was cancelled (RST_STREAM
// 11) and idle workers' Attach streams with it (docs/operations.md). What
// a stalled message may hold is bounded by the receive limit instead.
inline constexpr int64_t kDefaultGrpcMemoryBytes = int64_t{512} << 20;

class WorkersService;
class JobsService;
class KeyValueService;

struct CoordinatorServerConfig {
  std::string listen_address = "127.0.0.1:7070";  // port 0 picks a free port
  std::string metrics_address = "127.0.0.1:9464";
  // Jobs in <data_dir>, checkpoints in <data_dir>/checkpoints (two RocksDB
  // databases, docs/checkpoint-format.md).
  std::string data_dir = "cohort-data";
  Coordinator::Options coordinator;
  CheckpointsServiceLimits checkpoints;
  absl::Duration checkpoint_abandon_after = absl::Minutes(10);
  int checkpoint_io_threads = 4;
  absl::Duration tick_interval = absl::Milliseconds(50);
  // TLS on the gRPC port (empty cert: plaintext) and who may call what
  // (Authorizer). Plaintext on an address other than loopback needs
  // allow_insecure, and bearer tokens need TLS.
  ServerTlsFiles tls;
  std::string auth_tokens_file;
  bool allow_insecure = false;
  // Per-client cap on long-lived calls (StreamLimiter); <= 0: none.
  int max_streams_per_client = 1024;
  // Largest request message gRPC accepts (ResourceExhausted above it).
  int max_message_bytes = static_cast<int>(kDefaultMaxMessageBytes);
  // Memory gRPC may hold for all connections together (its resource
  // quota): what peers, authenticated or not, can make it buffer, e.g.
  // messages sent all but their last byte.
  int64_t grpc_memory_bytes = kDefaultGrpcMemoryBytes;
  // Concurrent calls on one HTTP/2 connection.
  int max_streams_per_connection = 256;
  // Completion queues (one thread each) serving Attach streams
  // (AttachStreams).
  int attach_queues = 8;
};

// Thread-safe: Shutdown may be called from any thread (e.g. a signal waiter).
class CoordinatorServer {
 public:
  // Opens the data dir (Unavailable if another coordinator holds it), starts
  // serving. Errors name the address or directory at fault.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(CoordinatorServerConfig config);
  ~CoordinatorServer();

  // The bound gRPC address (host:port) and metrics address.
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_server_->address(); }

  // Blocks until a Shutdown (from any thread) has finished, so the caller
  // may destroy the server.
  void Wait();
  // Stops serving; returns once everything has stopped, also to a caller
  // that comes while another thread's Shutdown is still running.
  void Shutdown();

 private:
  CoordinatorServer() = default;
  void ShutdownOnce();
  void TickLoop();
  // Checkpoint upload housekeeping and gauges, on the ticker thread.
  void TickCheckpoints();

  std::string address_;
  absl::Duration tick_interval_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<Coordinator> coordinator_;
  // Before every service: they hold the gate.
  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<StreamLimiter> streams_;
  std::unique_ptr<CallGate> gate_;
  // Declared before the services and the server, so destroyed after them;
  // the executor (whose work uses the uploads and the store) goes first.
  std::unique_ptr<RocksDbCheckpointStore> checkpoint_store_;
  std::unique_ptr<CheckpointUploads> checkpoint_uploads_;
  std::unique_ptr<BlockingExecutor> checkpoint_executor_;
  std::unique_ptr<CheckpointsService> checkpoints_service_;
  UploadCounters reported_counters_;  // ticker thread only
  std::unique_ptr<WorkersService> workers_service_;
  std::unique_ptr<JobsService> jobs_service_;
  std::unique_ptr<KeyValueService> kv_service_;
  std::unique_ptr<grpc::Server> server_;
  absl::Notification stop_;
  std::thread ticker_;
  std::atomic<bool> shut_down_{false};
  absl::Notification shut_down_done_;
};

}  // namespace cohort::coordinator
