#pragma once
// EngineTrainerOptions: what configures an EngineTrainer
// (worker/engine/engine_trainer.h) and the parts it is made of, the
// SessionBuilder and the StateRestorer among them, which read the same
// fields. A header of its own so that those parts need not include the
// trainer.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "cohort/v1/workers.pb.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/tls_credentials.h"
#include "prometheus/registry.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/comm/kv_client.h"
#include "worker/compute/backend_factory.h"
#include "worker/engine/generation_comms.h"

namespace cohort::worker {

struct EngineTrainerOptions {
  // The coordinator (its KeyValue service bootstraps the communicators; its
  // Checkpoints service stores the checkpoints).
  CoordinatorTarget coordinator;
  // OpenMP threads for compute; 0 = all cores.
  int num_threads = 0;
  // The CUDA device a GPU job's layers run on (the worker's --device_index).
  int device_index = 0;
  // How a GPU job runs attention (the worker's --fused_attention).
  compute::FusedAttention fused_attention = compute::FusedAttention::kAuto;
  // Whether a GPU job's device-resident step replays CUDA graphs (the
  // worker's --cuda_graphs).
  compute::CudaGraphs cuda_graphs = compute::CudaGraphs::kAuto;
  // Bound on building the communicators (all peers must publish).
  absl::Duration bootstrap_timeout = absl::Seconds(120);
  // UCX's network interfaces for groups across hosts
  // (comm::UcxContextOptions::net_devices); empty: UCX's choice.
  std::string ucx_net_devices;
  // How the data group's collectives run when it spans hosts.
  comm::CollectiveAlgorithm collectives = comm::CollectiveAlgorithm::kAuto;
  // Bound on each collective of a step, and on each round of a state transfer.
  absl::Duration collective_timeout = absl::Seconds(60);
  // How long a collective of a generation may run past its own timeout
  // before the call watchdog aborts it and every communicator of the
  // generation (worker/comm/call_watchdog.h): the bound on a call whose
  // transport does not keep its timeout (NCCL waiting on a dead peer).
  absl::Duration collective_watchdog_grace = absl::Seconds(10);
  // Bound on restoring from a checkpoint, and on each upload.
  absl::Duration checkpoint_timeout = absl::Minutes(10);
  // Concurrent download streams of a checkpoint restore (LoadCheckpoint).
  int checkpoint_load_streams = checkpoint::kDefaultLoadStreams;
  // Called from the training thread when a run ends on its own (see above).
  std::function<void(const JobId&, Generation, const absl::Status&)> on_finished;
  // Called from the training thread when a generation completes its first
  // step, so that the agent reports the progress at once rather than with
  // its next heartbeat: the coordinator times a recovery's first step by
  // that report (RecoveryStats.last_first_step_seconds), which otherwise
  // included up to a heartbeat interval of waiting (issue 43).
  std::function<void(const JobId&, Generation)> on_first_step;
  // Called from the training thread when a peer failed mid-step, with the
  // step's error (comm::FailedPeer names the peer where it is known).
  std::function<void(const JobId&, Generation, const std::vector<v1::HeldState>&,
                     const absl::Status&)>
      on_suspended;
  // Makes the bootstrap KvClient for a scope; default: the coordinator's.
  std::function<std::unique_ptr<comm::KvClient>(const comm::KvScopeRef&)> kv_factory;
  // Builds a generation's communicators; default: UCX, bootstrapped through
  // kv_factory's client (worker/engine/ucx_generation_comms.h). Tests give
  // in-process ones.
  CommsFactory comms_factory;
  // Makes the checkpoint client; default: gRPC to `coordinator`.
  std::function<std::unique_ptr<client::CheckpointClient>()> checkpoint_factory;
  // Where the checkpoint and recovery metrics go (none when null).
  std::shared_ptr<prometheus::Registry> registry;
  // When set, one line per completed step is appended to this file:
  //   job <id> generation <g> step <s> loss <loss as %a> time <unix seconds>
  // (hex float, exact bits; the time the step completed, to microseconds),
  // for comparing trajectories across runs and timing recoveries.
  std::string loss_log;
  // Bound on the memory of a session prepared ahead as a warm spare
  // (TrainingSession::EstimateBytes, checked before building); 0: never
  // prepare ahead.
  uint64_t warm_memory_bytes = 0;
  // Every time the engine reads: the phases of a Prepare, a restore's and a
  // step's durations, the loss log's timestamps, the bootstrap's deadline
  // (conventions: Pure core). Must outlive the trainer; the daemon leaves
  // the real one.
  const Clock* clock = RealClock::Get();
};

}  // namespace cohort::worker
