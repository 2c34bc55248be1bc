// cohort-coordinator: the long-running control plane (docs/operations.md).
#include <csignal>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "coordinator/service/coordinator_server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7070",
          "gRPC address (host:port) for workers and clients; port 0 picks a free port");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9464",
          "host:port serving Prometheus /metrics; port 0 picks a free port");
ABSL_FLAG(std::string, data_dir, "cohort-data",
          "RocksDB directory for jobs (and later checkpoints); created if missing. Restarting "
          "with the same directory restores every job");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Milliseconds(500),
          "how often workers must heartbeat (sent to each worker in its Welcome)");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(3),
          "silence after which a worker is declared lost; must exceed --heartbeat_interval. A "
          "broken stream is detected at once regardless");
ABSL_FLAG(absl::Duration, readopt_grace, absl::Seconds(10),
          "after a restart, how long members of running jobs may take to re-attach before they "
          "are treated as lost and their jobs re-planned");
ABSL_FLAG(std::string, log_level, "",
          "debug, info, warning or error; empty means $COHORT_LOG_LEVEL, else info");

namespace {

sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "cohort-coordinator: membership, mesh planning, job state and the KeyValue service.\n"
      "Usage: cohort-coordinator [--listen 0.0.0.0:7070] [--data_dir DIR] [flags]");
  absl::ParseCommandLine(argc, argv);
  // Block before any thread starts so every thread inherits the mask and
  // the signal waiter below receives them.
  sigset_t signals = BlockTerminationSignals();
  if (!cohort::log::ApplyLevelFlag(absl::GetFlag(FLAGS_log_level))) {
    std::cerr << "cohort-coordinator: --log_level must be debug, info, warning or error\n";
    return 64;
  }
  cohort::log::SetProcessTag("coordinator");

  cohort::coordinator::CoordinatorServerConfig config;
  config.listen_address = absl::GetFlag(FLAGS_listen);
  config.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  config.data_dir = absl::GetFlag(FLAGS_data_dir);
  config.coordinator.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  config.coordinator.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  config.coordinator.readopt_grace = absl::GetFlag(FLAGS_readopt_grace);

  auto server = cohort::coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) {
    std::cerr << "cohort-coordinator: " << server.status().message() << "\n";
    return 1;
  }
  std::thread signal_waiter([&signals, s = server->get()] {
    int sig = 0;
    sigwait(&signals, &sig);
    LOG(INFO) << "received signal " << sig;
    s->Shutdown();
  });
  (*server)->Wait();
  server->reset();
  // The waiter is still blocked in sigwait when shutdown came from elsewhere.
  signal_waiter.detach();
  return 0;
}
