// cohort-coordinator: the long-running control plane (docs/operations.md).
#include <malloc.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/flag_help.h"
#include "common/huge_page_malloc.h"
#include "common/log.h"
#include "common/message_limits.h"
#include "coordinator/server_flags.h"
#include "coordinator/service/coordinator_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "gRPC address (host:port) for workers and clients; port 0 picks a free port. An "
          "address other than loopback needs --tls_cert/--tls_key or --allow_insecure");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the gRPC port (leaf first); with --tls_key turns TLS on");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM bundle of the cluster CA: worker RPCs (Attach, KeyValue, checkpoint upload) then "
          "need a client certificate it signed, and a certificate from another CA fails the "
          "handshake");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "file of `ROLE NAME TOKEN` lines (ROLE read or admin): user RPCs then need a bearer "
          "token from it (admin for Submit, Cancel, Scale, Drain, Checkpoints.Delete). Needs "
          "TLS. Read once at start-up");
ABSL_FLAG(bool, allow_insecure, false,
          "allow plaintext gRPC on an address other than loopback (anyone who can reach it can "
          "steer the cluster)");
ABSL_FLAG(int, max_streams_per_client, 1024,
          "long-lived calls (Attach, Watch, checkpoint streams, KeyValue.WaitFor) one client "
          "address may hold open; more get RESOURCE_EXHAUSTED. 0: no limit");
ABSL_FLAG(int, max_message_bytes, static_cast<int>(cohort::kDefaultMaxMessageBytes),
          "largest gRPC request message accepted; larger ones get RESOURCE_EXHAUSTED. At least "
          "the default (264 KiB: a checkpoint upload's data piece or a KeyValue value of the "
          "default --max_kv_value_bytes, whole)");
ABSL_FLAG(int64_t, grpc_memory_bytes, cohort::coordinator::kDefaultGrpcMemoryBytes,
          "memory gRPC may hold for all connections together (its resource quota): bounds "
          "what peers, authenticated or not, can make the coordinator buffer");
ABSL_FLAG(int, max_streams_per_connection, 256,
          "concurrent calls on one HTTP/2 connection");
ABSL_FLAG(int, attach_queues, 8,
          "gRPC completion queues, one thread each, that serve workers' Attach streams (1-64); "
          "with tens of thousands of workers more queues keep each queue's bookkeeping short "
          "(docs/operations.md)");
ABSL_FLAG(int, max_kv_value_bytes, static_cast<int>(cohort::kDefaultMaxKvValueBytes),
          "largest KeyValue value; larger Sets get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_kv_bytes_per_job, 64 << 20,
          "KeyValue keys plus values one job may hold (all its generations); Sets beyond get "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_kv_bytes, int64_t{1} << 30,
          "KeyValue keys plus values held in all; Sets beyond get RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9464",
          "host:port serving Prometheus /metrics; port 0 picks a free port");
ABSL_FLAG(std::string, data_dir, "cohort-data",
          "RocksDB directory for jobs, with checkpoints in its checkpoints/ subdirectory; created "
          "if missing. Restarting with the same directory restores every job and every "
          "committed checkpoint");
ABSL_FLAG(int, max_checkpoint_uploads, 64,
          "concurrent checkpoint Upload streams (one per writing rank); more get "
          "RESOURCE_EXHAUSTED and retry");
ABSL_FLAG(int, max_checkpoint_downloads, 64,
          "concurrent checkpoint Download streams; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_checkpoint_chunk_bytes, 64 << 20,
          "largest checkpoint chunk accepted; with the stream limits it bounds the memory "
          "checkpoints take: (3 x uploads + 4 x downloads) x this");
ABSL_FLAG(absl::Duration, checkpoint_abandon_after, absl::Minutes(10),
          "an uncommitted checkpoint upload with no activity for this long is abandoned and its "
          "bytes freed");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Milliseconds(500),
          "how often workers must heartbeat (sent to each worker in its Welcome)");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(3),
          "silence after which a worker is declared lost; must exceed --heartbeat_interval. A "
          "broken stream is detected at once regardless");
ABSL_FLAG(absl::Duration, readopt_grace, absl::Seconds(10),
          "after a restart, how long members of running jobs may take to re-attach before they "
          "are treated as lost and their jobs re-planned (workers holding an assignment retry at "
          "least every ~1.2 s, so keep this above ~3 s)");
ABSL_FLAG(absl::Duration, isolation_limit, absl::Minutes(2),
          "when the coordinator hears from no worker at all (two or more attached, all silent "
          "for max(heartbeat_timeout / 2, 2 heartbeat intervals)) it takes its own network to be "
          "cut and fences no one until it hears from a worker again, for at most this long; then "
          "the silent workers get --readopt_grace to re-attach. 0: never assume so");
ABSL_FLAG(absl::Duration, suspend_timeout, absl::Seconds(10),
          "how long members of a job being re-planned may take to answer Suspend with the state "
          "they hold; members silent that long are fenced as hung");
ABSL_FLAG(absl::Duration, finished_job_retention, absl::Hours(24 * 7),
          "a finished job (completed, failed, cancelled) is deleted this long after it finished; "
          "its checkpoints stay. 0 keeps finished jobs until `cohortctl delete`");
ABSL_FLAG(absl::Duration, prepare_timeout, absl::Minutes(10),
          "a new generation of a job whose members have not all reported ready within this "
          "time is re-planned (the workers' own deadlines normally end a failed Prepare first)");
ABSL_FLAG(absl::Duration, partition_hold, absl::Seconds(30),
          "workers of a job that report they cannot reach each other while both are alive (a "
          "partial partition) are kept apart in its plans this long, doubling on each repeat (up "
          "to 16x); then the job tries to grow back onto them. Workers on different hosts are "
          "kept apart host by host");
ABSL_FLAG(int, warm_spares_per_job, 1,
          "idle workers named warm spares of each running job: each prepares the session of a "
          "place in the job ahead (within its --warm_spare_memory_bytes), so taking that place "
          "after a failure costs only communicators and the state transfer; 0: none");
ABSL_FLAG(absl::Duration, hang_timeout_floor, absl::Seconds(30),
          "a running job whose steps stop advancing for max(this, --hang_step_multiple x its "
          "median step time) fences its members that are not waiting for peers; 0 disables "
          "stall detection");
ABSL_FLAG(double, hang_step_multiple, 20.0,
          "see --hang_timeout_floor");
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
  cohort::ReexecWithHugePageMalloc(argv);  // first: it may restart the process
  // Checkpoint chunks (up to --max_checkpoint_chunk_bytes each) pass through
  // buffers of a few MiB. glibc maps such sizes afresh for each one and
  // returns them on free, so every chunk paid page faults to zero new pages
  // (8% of the coordinator's CPU during saves). Serving them from the heap,
  // and keeping freed memory for reuse, removes that; the stream limits
  // still bound how much is held.
  mallopt(M_MMAP_THRESHOLD, 128 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // One malloc arena. Chunk memory is allocated on one thread (a gRPC
  // handler inserting into a memtable) and freed on another (the flush
  // thread); with glibc's per-thread arenas the freed blocks went back to
  // arenas that the next allocations did not use, so each save faulted in
  // fresh memory again: 0.29-0.39 GB/s saves and a 737 MB peak on a VM whose
  // first-touch faults run at 0.3-0.6 GB/s, against 0.63-0.92 GB/s and
  // 557 MB with one arena (docs/architecture.md, "Checkpoints"). An operator's
  // glibc.malloc.arena_max in GLIBC_TUNABLES wins.
  if (!cohort::TunableIsSet(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.arena_max")) {
    mallopt(M_ARENA_MAX, 1);
  }
  absl::SetProgramUsageMessage(
      "cohort-coordinator: membership, mesh planning, job state, checkpoints and the KeyValue "
      "service.\n"
      "Usage: cohort-coordinator [--listen 127.0.0.1:7070] [--data_dir DIR] [flags]");
  cohort::ExitWithHelpIfAsked(argc, argv, "coordinator/main.cc");
  absl::ParseCommandLine(argc, argv);
  // Builds with assertions keep Abseil's mutex deadlock detection on, which
  // records every lock in one global graph: at 10,000 heartbeats a second it
  // cost more CPU than handling them (tests keep it; lock order is checked
  // there).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
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
  config.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  config.tls.key = absl::GetFlag(FLAGS_tls_key);
  config.tls.client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  config.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  config.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
  config.max_streams_per_client = absl::GetFlag(FLAGS_max_streams_per_client);
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  config.coordinator.kv.max_value_bytes = static_cast<size_t>(
      std::max(1, absl::GetFlag(FLAGS_max_kv_value_bytes)));
  const int64_t kv_per_job = absl::GetFlag(FLAGS_max_kv_bytes_per_job);
  const int64_t kv_total = absl::GetFlag(FLAGS_max_kv_bytes);
  if (config.max_streams_per_client < 0 ||
      config.max_message_bytes < static_cast<int>(cohort::kDefaultMaxMessageBytes) ||
      absl::GetFlag(FLAGS_max_kv_value_bytes) < 1 || kv_per_job < (1 << 20) ||
      kv_total < kv_per_job) {
    std::cerr << "cohort-coordinator: --max_streams_per_client must be >= 0, "
                 "--max_message_bytes >= "
              << cohort::kDefaultMaxMessageBytes
              << " (a checkpoint upload's data messages are 256 KiB), --max_kv_value_bytes >= 1, "
                 "--max_kv_bytes_per_job >= 1 MiB and --max_kv_bytes >= --max_kv_bytes_per_job\n";
    return 64;
  }
  // A value the limit would cut off in the transport would fail with gRPC's
  // message about message sizes instead of the KeyValue limit's.
  if (static_cast<size_t>(absl::GetFlag(FLAGS_max_kv_value_bytes)) + cohort::kMessageEnvelopeBytes >
      static_cast<size_t>(config.max_message_bytes)) {
    std::cerr << "cohort-coordinator: --max_kv_value_bytes ("
              << absl::GetFlag(FLAGS_max_kv_value_bytes) << ") plus "
              << cohort::kMessageEnvelopeBytes
              << " bytes for the rest of a KeyValue.Set must fit in --max_message_bytes ("
              << config.max_message_bytes << ")\n";
    return 64;
  }
  config.grpc_memory_bytes = absl::GetFlag(FLAGS_grpc_memory_bytes);
  config.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  config.attach_queues = absl::GetFlag(FLAGS_attach_queues);
  if (config.grpc_memory_bytes < (int64_t{16} << 20) || config.max_streams_per_connection < 1 ||
      config.max_streams_per_connection > 65536 || config.attach_queues < 1 ||
      config.attach_queues > 64) {
    std::cerr << "cohort-coordinator: --grpc_memory_bytes must be >= 16 MiB, "
                 "--max_streams_per_connection within [1, 65536] and --attach_queues within "
                 "[1, 64]\n";
    return 64;
  }
  config.coordinator.kv.max_bytes_per_job = static_cast<size_t>(kv_per_job);
  config.coordinator.kv.max_total_bytes = static_cast<size_t>(kv_total);
  config.coordinator.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  config.coordinator.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  config.coordinator.readopt_grace = absl::GetFlag(FLAGS_readopt_grace);
  config.coordinator.isolation_limit = absl::GetFlag(FLAGS_isolation_limit);
  config.coordinator.suspend_timeout = absl::GetFlag(FLAGS_suspend_timeout);
  config.coordinator.prepare_timeout = absl::GetFlag(FLAGS_prepare_timeout);
  config.coordinator.warm_spares_per_job = absl::GetFlag(FLAGS_warm_spares_per_job);
  config.coordinator.partition_hold = absl::GetFlag(FLAGS_partition_hold);
  if (config.coordinator.warm_spares_per_job < 0 || config.coordinator.warm_spares_per_job > 64) {
    std::cerr << "cohort-coordinator: --warm_spares_per_job must be within [0, 64]\n";
    return 64;
  }
  config.coordinator.finished_retention = absl::GetFlag(FLAGS_finished_job_retention);
  if (absl::Status retention = cohort::CheckDuration(
          "finished_job_retention", config.coordinator.finished_retention, absl::ZeroDuration(),
          absl::Hours(24 * 3650));
      !retention.ok()) {
    std::cerr << "cohort-coordinator: " << retention.message() << "\n";
    return 64;
  }
  config.coordinator.hang_timeout_floor = absl::GetFlag(FLAGS_hang_timeout_floor);
  config.coordinator.hang_step_multiple = absl::GetFlag(FLAGS_hang_step_multiple);
  config.checkpoints.max_uploads = absl::GetFlag(FLAGS_max_checkpoint_uploads);
  config.checkpoints.max_downloads = absl::GetFlag(FLAGS_max_checkpoint_downloads);
  config.checkpoints.max_chunk_bytes = absl::GetFlag(FLAGS_max_checkpoint_chunk_bytes);
  config.checkpoint_abandon_after = absl::GetFlag(FLAGS_checkpoint_abandon_after);
  for (const absl::Status& checked :
       {cohort::CheckHostPort("listen", config.listen_address),
        cohort::CheckHostPort("metrics_address", config.metrics_address),
        cohort::coordinator::CheckTimingFlags(cohort::coordinator::TimingFlags{
            config.coordinator.heartbeat_interval, config.coordinator.heartbeat_timeout,
            config.coordinator.readopt_grace, config.coordinator.suspend_timeout,
            config.coordinator.prepare_timeout, config.coordinator.hang_timeout_floor,
            config.checkpoint_abandon_after, config.coordinator.isolation_limit,
            config.coordinator.partition_hold})}) {
    if (!checked.ok()) {
      std::cerr << "cohort-coordinator: " << checked.message() << "\n";
      return 64;
    }
  }
  const double multiple = config.coordinator.hang_step_multiple;
  if (!(multiple >= 1 && multiple <= 1e6)) {
    std::cerr << "cohort-coordinator: --hang_step_multiple must be within [1, 1e6]\n";
    return 64;
  }
  if (config.checkpoints.max_uploads < 1 || config.checkpoints.max_downloads < 1 ||
      config.checkpoints.max_uploads > 65536 || config.checkpoints.max_downloads > 65536 ||
      config.checkpoints.max_chunk_bytes < (1 << 20) ||
      config.checkpoints.max_chunk_bytes > (int64_t{1} << 32)) {
    std::cerr << "cohort-coordinator: --max_checkpoint_uploads and --max_checkpoint_downloads "
                 "must be within [1, 65536] and --max_checkpoint_chunk_bytes within [1 MiB, 4 GiB]\n";
    return 64;
  }

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
