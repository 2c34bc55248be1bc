#include "worker/agent/worker_daemon.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/process_info.h"
#include "common/status_macros.h"
#include "worker/agent/idle_trainer.h"
#include "worker/comm/net_interface.h"
#include "worker/device/device_discovery.h"
#include "worker/engine/engine_trainer.h"

namespace cohort::worker {

std::string DefaultWorkerId(const std::string& host, v1::DeviceKind kind, int index) {
  return absl::StrCat(host, "-", DeviceKindName(kind), "-", index);
}

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Create(const WorkerConfig& config) {
  if (config.trainer != "engine" && config.trainer != "idle") {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: must be engine or idle, got '", config.trainer, "'"));
  }
  if (config.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads: must be >= 0, got ", config.threads));
  }
  auto daemon = std::unique_ptr<WorkerDaemon>(new WorkerDaemon());
  ASSIGN_OR_RETURN(daemon->device_, DiscoverDevice(config.device_kind, config.device_index));
  const DeviceInfo& device = daemon->device_;
  LOG(INFO) << "device " << DeviceKindName(device.kind) << " " << device.index << ": "
            << device.name << ", " << device.cores
            << (device.kind == v1::DEVICE_KIND_GPU ? " SMs" : " cores") << ", "
            << device.memory_bytes / (1 << 20) << " MiB"
            << (device.kind == v1::DEVICE_KIND_GPU
                    ? absl::StrCat(", compute capability ", device.compute_capability,
                                   ", self-test passed")
                    : std::string());

  auto registry = std::make_shared<prometheus::Registry>();
  ASSIGN_OR_RETURN(daemon->metrics_server_,
                   MetricsServer::Create(config.metrics_address, registry));
  LOG(INFO) << "serving metrics at http://" << daemon->metrics_server_->address() << "/metrics";

  ASSIGN_OR_RETURN(CoordinatorTarget target, MakeCoordinatorTarget(config.coordinator, config.tls));
  WorkerAgentOptions options;
  options.identity.host = config.host.empty() ? HostName() : config.host;
  options.identity.worker_id =
      config.worker_id.empty()
          ? DefaultWorkerId(options.identity.host, config.device_kind, config.device_index)
          : config.worker_id;
  options.identity.device_kind = config.device_kind;
  options.identity.device_index = config.device_index;
  options.identity.capabilities = CapabilitiesFor(device);
  options.identity.metrics_address = daemon->metrics_server_->address();
  // UCX between hosts takes the interface of the announced address.
  const std::string announced = options.identity.metrics_address.substr(
      0, options.identity.metrics_address.rfind(':'));
  const std::string ucx_net_devices = comm::ResolveNetDevices(
      config.ucx_net_devices, absl::StrCat(absl::StripPrefix(absl::StripSuffix(announced, "]"), "[")));
  LOG(INFO) << "UCX network devices between hosts: "
            << (ucx_net_devices.empty() ? std::string("UCX's choice") : ucx_net_devices)
            << " (--ucx_net_devices=" << config.ucx_net_devices << ")";
  daemon->incarnation_ = NewIncarnation();
  options.incarnation = daemon->incarnation_;
  options.backoff = config.backoff;
  LOG(INFO) << "worker " << options.identity.worker_id << " on host " << options.identity.host
            << ", incarnation " << options.incarnation << ", coordinator " << config.coordinator
            << (target.secure ? " (TLS)" : " (plaintext)");
  if (config.trainer == "idle") {
    daemon->trainer_ = std::make_unique<IdleTrainer>();
  } else {
    EngineTrainerOptions engine;
    engine.coordinator = target;
    engine.num_threads = config.threads;
    engine.device_index = config.device_index;
    engine.fused_attention = config.fused_attention;
    engine.cuda_graphs = config.cuda_graphs;
    engine.registry = registry;
    engine.loss_log = config.loss_log;
    engine.checkpoint_load_streams = config.checkpoint_load_streams;
    engine.collective_timeout = config.collective_timeout;
    engine.collective_watchdog_grace = config.collective_watchdog_grace;
    engine.ucx_net_devices = ucx_net_devices;
    engine.collectives = config.collectives;
    engine.warm_memory_bytes = config.warm_spare_memory_bytes < 0
                                   ? static_cast<uint64_t>(device.memory_bytes) / 4
                                   : static_cast<uint64_t>(config.warm_spare_memory_bytes);
    // The agent exists before any Prepare can start training.
    WorkerDaemon* self = daemon.get();
    engine.on_suspended = [self](const JobId& job, Generation generation,
                                 const std::vector<v1::HeldState>& held,
                                 const absl::Status& why) {
      self->agent_->ReportSuspended(job, generation, held, why);
    };
    engine.on_finished = [self](const JobId& job, Generation generation,
                                const absl::Status& status) {
      self->agent_->ReportTrainingFinished(job, generation, status);
    };
    engine.on_first_step = [self](const JobId&, Generation) { self->agent_->ReportProgressNow(); };
    daemon->trainer_ = std::make_unique<EngineTrainer>(std::move(engine));
  }
  std::shared_ptr<grpc::Channel> channel = NewCoordinatorChannel(target);
  options.wait_for_coordinator = [channel](absl::Time deadline) {
    return channel->WaitForConnected(absl::ToChronoTime(deadline));
  };
  daemon->agent_ = std::make_unique<WorkerAgent>(v1::Workers::NewStub(channel),
                                                 daemon->trainer_.get(), RealClock::Get(),
                                                 std::move(registry), std::move(options));
  return daemon;
}

}  // namespace cohort::worker
