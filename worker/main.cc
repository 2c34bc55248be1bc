// cohort-worker: one worker daemon per device. Flags -> WorkerConfig -> run.
// Exits 0 after a Drain or SIGINT/SIGTERM, 1 if the worker cannot start
// (bad flags, unusable device, metrics port taken).

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/flag_checks.h"
#include "common/flag_help.h"
#include "common/huge_page_malloc.h"
#include "common/log.h"
#include "worker/agent/worker_daemon.h"
#include "worker/comm/hierarchical_communicator.h"

ABSL_FLAG(std::string, coordinator, "localhost:7070",
          "Coordinator gRPC address, host:port. The worker keeps retrying (with backoff) "
          "while it is unreachable.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM bundle that signed the coordinator's certificate; set: connect with TLS");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate signed by the cluster CA (a coordinator with --tls_client_ca "
          "refuses workers without one); needs --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the coordinator's certificate must carry, when it differs from the host of "
          "--coordinator (e.g. connecting by IP)");
ABSL_FLAG(std::string, worker_id, "",
          "Stable worker name; a restart with the same name replaces the old process. "
          "Default: <host>-<device>-<device_index>.");
ABSL_FLAG(std::string, host, "",
          "Host name announced to the coordinator, which keeps tensor groups on one host. "
          "Default: this machine's hostname. Tests pass 127.0.0.1 or fake names.");
ABSL_FLAG(std::string, device, "cpu",
          "Device to train on: cpu or gpu. gpu needs a CUDA build and a working GPU "
          "(a self-test kernel runs at startup).");
ABSL_FLAG(int, device_index, 0,
          "CUDA device ordinal for --device gpu; for --device cpu, the slot number of "
          "this worker on its host.");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:0",
          "host:port to serve Prometheus /metrics on; port 0 picks a free port "
          "(logged, and announced to the coordinator).");
ABSL_FLAG(std::string, trainer, "engine",
          "engine: train assigned jobs. idle: join meshes and follow coordinator commands "
          "without training (for control-plane tests and failure drills).");
ABSL_FLAG(int, threads, 0,
          "Compute threads (OpenMP) for training; 0 means $OMP_NUM_THREADS, else all cores. "
          "Results do not depend on it.");
ABSL_FLAG(std::string, loss_log, "",
          "append one line per completed training step (job, generation, step, loss as a hex "
          "float: exact bits, completion time in unix seconds) to this file, to compare "
          "trajectories across runs; empty: off");
ABSL_FLAG(int64_t, warm_spare_memory_bytes, -1,
          "As a spare of a running job (the coordinator's WarmUp), prepare the session of "
          "the place it would take ahead, if its memory estimate is at most this many bytes; "
          "0: never; -1: a quarter of the device's memory.");
ABSL_FLAG(int, checkpoint_load_streams, 4,
          "Concurrent download streams when restoring from a checkpoint: the coordinator reads "
          "one stream's chunk from disk while another's is on the wire. Within [1, 64].");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Seconds(60),
          "How long one collective or point-to-point exchange of a training step may wait for "
          "its peers before the step fails (DeadlineExceeded) and the worker reports to the "
          "coordinator for a new plan. A peer that dies or becomes unreachable is usually noticed "
          "sooner (Unavailable). Within [1s, 1h].");
ABSL_FLAG(absl::Duration, collective_watchdog_grace, absl::Seconds(10),
          "How long a collective or point-to-point call of a training step may run past "
          "--collective_timeout before the call watchdog aborts it and every communicator of its "
          "generation (the bound on a transport that does not keep its own timeout, such as "
          "NCCL waiting on a dead peer); the step then fails as on a lost peer (DeadlineExceeded) "
          "and the worker keeps its state for the next plan. Within [1s, 1h].");
ABSL_FLAG(std::string, ucx_net_devices, "auto",
          "Network interfaces UCX uses between hosts: \"auto\" (the interface holding "
          "--metrics_address's address; UCX's choice when that is loopback or a name), "
          "\"all\" (UCX's choice), or UCX's own list (e.g. \"eth0\" or \"mlx5_0:1\"). "
          "$UCX_NET_DEVICES, when set, wins.");
ABSL_FLAG(std::string, collectives, "auto",
          "How a data-parallel group that spans hosts runs its collectives (gradients, ZeRO-1 "
          "shards, weights): \"hierarchical\" (reduce within each host over shared memory, "
          "across hosts between lanes, share within the host), \"flat\" (one ring or pairwise "
          "exchange over the group, host by host) or \"auto\" "
          "(hierarchical when every host holds the same number, two or more, of the group's "
          "ranks; else flat). \"hierarchical\" fails a generation whose hosts do not allow it.");
ABSL_FLAG(std::string, fused_attention, "auto",
          "How a GPU job runs causal attention: \"cudnn\" (cuDNN's fused flash attention, "
          "loaded at run time from this machine: $COHORT_CUDNN_LIBRARY, the loader's search "
          "path, /usr/local/cuda/lib64, PyTorch's nvidia-cudnn wheel; the worker refuses to "
          "start without it), \"off\" (the backend's own kernels) or \"auto\" (cuDNN where "
          "it loads and plans the job's shapes in precision bf16, else the kernels; the choice "
          "and the reason are logged once and exported as "
          "cohort_worker_attention_implementation).");
ABSL_FLAG(std::string, cuda_graphs, "auto",
          "Whether a GPU job's one-rank (device-resident) step captures each micro-batch's "
          "forward and backward in a CUDA graph and replays it: \"auto\" (captured at a "
          "shape's second micro-batch, replayed from then on; where a capture fails the ops "
          "run one by one, logged once) or \"off\" (one launch per op). Exported as "
          "cohort_worker_cuda_graph_replays_total and cohort_worker_cuda_graphs_in_use.");
ABSL_FLAG(std::string, log_level, "",
          "Minimum log level: debug, info, warning or error; empty means $COHORT_LOG_LEVEL, "
          "else info.");

namespace {


// Libraries start threads of their own before main() can block signals
// (OpenBLAS creates its pool when it is loaded), and a SIGTERM delivered to
// one of those would kill the process with the default action. This handler
// runs on such a thread and forwards the signal to the signal thread, where
// it is blocked and taken by sigwait; before that thread exists it is
// remembered.
std::atomic<unsigned long> signal_thread_id{0};
volatile sig_atomic_t early_signal = 0;

void ForwardSignal(int signal) {
  const unsigned long target = signal_thread_id.load();
  if (target == 0) {
    early_signal = signal;
    return;
  }
  pthread_kill(static_cast<pthread_t>(target), signal);
}

int Fail(const std::string& message) {
  std::cerr << "cohort-worker: " << message << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  cohort::ReexecWithHugePageMalloc(argv);  // first: it may restart the process
  absl::SetProgramUsageMessage(
      "Cohort worker daemon: attaches to the coordinator and trains on one device.\n"
      "  cohort-worker --coordinator=host:7070 --device=cpu");
  cohort::ExitWithHelpIfAsked(argc, argv, "worker/main.cc");
  absl::ParseCommandLine(argc, argv);
  // Several workers often share a host's cores; OpenMP's default of spinning
  // idle threads then starves the other workers' threads (steps 50x slower
  // measured with 2 threads on a busy 2-core host). Sleep instead, unless
  // the operator chose otherwise. Set before OpenMP starts any thread.
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);

  if (!cohort::log::ApplyLevelFlag(absl::GetFlag(FLAGS_log_level))) {
    return Fail("--log_level must be debug, info, warning or error");
  }

  cohort::worker::WorkerConfig config;
  config.coordinator = absl::GetFlag(FLAGS_coordinator);
  config.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  config.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  config.tls.key = absl::GetFlag(FLAGS_tls_key);
  config.tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  config.worker_id = absl::GetFlag(FLAGS_worker_id);
  config.host = absl::GetFlag(FLAGS_host);
  const std::string device = absl::AsciiStrToLower(absl::GetFlag(FLAGS_device));
  if (device == "cpu") {
    config.device_kind = cohort::v1::DEVICE_KIND_CPU;
  } else if (device == "gpu") {
    config.device_kind = cohort::v1::DEVICE_KIND_GPU;
  } else {
    return Fail("--device must be cpu or gpu, got '" + device + "'");
  }
  config.device_index = absl::GetFlag(FLAGS_device_index);
  config.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  config.trainer = absl::GetFlag(FLAGS_trainer);
  config.threads = absl::GetFlag(FLAGS_threads);
  // What the coordinator would refuse in the Hello (coordinator/
  // hello_validator.h), refused here at once instead of on every attach.
  for (const absl::Status& checked :
       {config.worker_id.empty() ? absl::OkStatus()
                                 : cohort::CheckName("--worker_id", config.worker_id, 128),
        config.host.empty() ? absl::OkStatus() : cohort::CheckName("--host", config.host, 253),
        cohort::CheckHostPort("metrics_address", config.metrics_address)}) {
    if (!checked.ok()) return Fail(std::string(checked.message()));
  }
  if (config.device_index < 0 || config.device_index > 4095) {
    return Fail("--device_index must be within [0, 4095]");
  }
  if (config.threads < 0 || config.threads > 4096) {
    return Fail("--threads must be within [0, 4096] (0: $OMP_NUM_THREADS, else all cores)");
  }
  config.loss_log = absl::GetFlag(FLAGS_loss_log);
  config.warm_spare_memory_bytes = absl::GetFlag(FLAGS_warm_spare_memory_bytes);
  if (config.warm_spare_memory_bytes < -1) {
    return Fail("--warm_spare_memory_bytes must be -1 (a quarter of the device's memory), 0 "
                "(never prepare ahead) or a byte count");
  }
  config.checkpoint_load_streams = absl::GetFlag(FLAGS_checkpoint_load_streams);
  if (config.checkpoint_load_streams < 1 || config.checkpoint_load_streams > 64) {
    return Fail("--checkpoint_load_streams must be within [1, 64]");
  }
  absl::StatusOr<cohort::comm::CollectiveAlgorithm> collectives =
      cohort::comm::ParseCollectiveAlgorithm(absl::GetFlag(FLAGS_collectives));
  if (!collectives.ok()) return Fail(absl::StrCat("--collectives: ", collectives.status().message()));
  config.collectives = *collectives;
  const std::optional<cohort::compute::FusedAttention> fused_attention =
      cohort::compute::FusedAttentionFromName(absl::GetFlag(FLAGS_fused_attention));
  if (!fused_attention.has_value()) return Fail("--fused_attention must be auto, cudnn or off");
  config.fused_attention = *fused_attention;
  const std::optional<cohort::compute::CudaGraphs> cuda_graphs =
      cohort::compute::CudaGraphsFromName(absl::GetFlag(FLAGS_cuda_graphs));
  if (!cuda_graphs.has_value()) return Fail("--cuda_graphs must be auto or off");
  config.cuda_graphs = *cuda_graphs;
  if (config.fused_attention == cohort::compute::FusedAttention::kCudnn) {
    if (absl::Status cudnn = cohort::compute::CheckCudnnLoads(); !cudnn.ok()) {
      return Fail(absl::StrCat("--fused_attention=cudnn: ", cudnn.message()));
    }
  }
  config.ucx_net_devices = absl::GetFlag(FLAGS_ucx_net_devices);
  if (config.ucx_net_devices.empty() || config.ucx_net_devices.size() > 256) {
    return Fail("--ucx_net_devices must be auto, all or a UCX device list (1 to 256 characters)");
  }
  config.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  if (absl::Status checked = cohort::CheckDuration("collective_timeout", config.collective_timeout,
                                                   absl::Seconds(1), absl::Hours(1));
      !checked.ok()) {
    return Fail(std::string(checked.message()));
  }
  config.collective_watchdog_grace = absl::GetFlag(FLAGS_collective_watchdog_grace);
  if (absl::Status checked =
          cohort::CheckDuration("collective_watchdog_grace", config.collective_watchdog_grace,
                                absl::Seconds(1), absl::Hours(1));
      !checked.ok()) {
    return Fail(std::string(checked.message()));
  }
  cohort::log::SetProcessTag("worker");

  // Block SIGINT/SIGTERM in every thread (threads inherit the mask, so this
  // comes before any is started); one thread takes them with sigwait and asks
  // the agent to shut down, which a signal handler could not do safely.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  struct sigaction forward {};
  forward.sa_handler = ForwardSignal;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGINT, &forward, nullptr);
  sigaction(SIGTERM, &forward, nullptr);

  auto daemon = cohort::worker::WorkerDaemon::Create(config);
  if (!daemon.ok()) return Fail(daemon.status().ToString());
  cohort::log::SetProcessTag("worker " + (*daemon)->agent().identity().worker_id);

  std::atomic<bool> finished{false};
  std::thread signal_thread([&] {
    signal_thread_id.store(static_cast<unsigned long>(pthread_self()));
    if (early_signal != 0) {
      LOG(INFO) << "received a signal during start-up";
      (*daemon)->Shutdown();
    }
    while (true) {
      int signal = 0;
      if (sigwait(&signals, &signal) != 0) return;
      if (finished.load()) return;  // woken by main to exit
      LOG(INFO) << "received " << (signal == SIGINT ? "SIGINT" : "SIGTERM");
      (*daemon)->Shutdown();
    }
  });
  const absl::Status status = (*daemon)->Run();
  finished.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (!status.ok()) return Fail(status.ToString());
  return 0;
}
