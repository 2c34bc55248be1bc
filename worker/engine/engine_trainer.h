#pragma once
// EngineTrainer: the worker's Trainer that really trains. For each
// generation of a job it builds the communicators (one UCX context over the
// generation's participants, bootstrapped through the coordinator's
// KeyValue service under (job, generation); one communicator per mesh axis
// group, plus one over every participant for state transfers), a
// TrainingSession for the rank's layout, then gets the state the
// generation's recovery plan names and trains from its step:
//
//   PEER        from the previous generation's members' memory (this
//               worker's own included), box by box over UCX
//               (worker/checkpoint/state_transfer.h), into any layout
//   CHECKPOINT  from the checkpoint the plan names, re-sharded
//   NONE        the job's newest checkpoint if any, else
//               checkpoint.resume_from_job's, else the initial weights
//
// A kept session. When the plan leaves this rank's shapes unchanged (the
// same job spec, layout and coordinates: a spare takes a lost rank's place,
// a drain with a spare), the new generation trains on the previous one's
// session (model, optimizer state, activations, data pipeline, versions)
// and builds only its communicators; the state is then in place and the
// restore moves nothing into it. Until the new generation has trained a
// step, the session still counts as holding the old generation's state.
//
// A warm spare (Warm). An idle worker the coordinator names a spare of a
// running job builds the session of the place it names in the background,
// over communicators attached to no generation, within
// options.warm_memory_bytes; a Prepare of a place with the same shapes takes
// it (and builds only communicators), any other Prepare releases it first.
//
// State kept for peer recovery: every step keeps its previous version and,
// with ZeRO-1, mirrors of the neighbours' optimizer shards (train/
// state_versions.h). A generation's session stays in memory after a
// Suspend, and the previous generation's is kept until the new one has
// completed a step, so a failure during a recovery can still be recovered
// from the older state.
//
// The steps themselves run in RunTrainingLoop (worker/engine/training_loop.h), on
// the generation's training thread; this class builds the generation,
// restores its state and turns how the loop ended into the callbacks below.
//
// Checkpoints. With checkpoint.interval_steps = N > 0, after every N-th step
// and after the last one, the rank snapshots its share of the state and
// uploads it in the background (worker/checkpoint/checkpoint_writer.h); the
// final upload ends before the run reports completion.
//
// How a run ends:
//   all steps done              on_finished(OK)         -> COMPLETED
//   a peer died (Unavailable)   on_suspended(held states): the coordinator
//                               suspends the others and re-plans
//   Suspend/Stop/a new Prepare  nothing (Aborted is expected)
//   anything else               on_finished(error)      -> FAILED
//
// Thread-safe, per the Trainer contract.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "common/tls_credentials.h"
#include "prometheus/registry.h"
#include "worker/agent/trainer.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/checkpoint_metrics.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/comm/kv_client.h"
#include "worker/engine/communication_metrics.h"
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
  // Bound on building the communicators (all peers must publish).
  absl::Duration bootstrap_timeout = absl::Seconds(120);
  // UCX's network interfaces for groups across hosts
  // (comm::UcxContextOptions::net_devices); empty: UCX's choice.
  std::string ucx_net_devices;
  // How the data group's collectives run when it spans hosts.
  comm::CollectiveAlgorithm collectives = comm::CollectiveAlgorithm::kAuto;
  // Bound on each collective of a step, and on each round of a state transfer.
  absl::Duration collective_timeout = absl::Seconds(60);
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
};

class EngineTrainer : public Trainer {
 public:
  explicit EngineTrainer(EngineTrainerOptions options);
  ~EngineTrainer() override;

  // Errors: the spec's (InvalidArgument naming the field; Unimplemented for
  // GPU jobs), the data's (NotFound, DataLoss), the bootstrap's
  // (DeadlineExceeded when peers never show up, Aborted when the generation
  // ends first), the restore's (FailedPrecondition for a checkpoint of
  // another model or a missing resume_from checkpoint or peer state,
  // DataLoss for a corrupt checkpoint, Unavailable when a peer died during
  // the transfer), Cancelled when Stop() or Interrupt() interrupts it.
  absl::Status Prepare(const Assignment& assignment) override;
  std::vector<v1::HeldState> Suspend() override;
  void Interrupt(const JobId& job, Generation generation) override;
  absl::Status Donate(const Assignment& assignment) override;
  void Stop() override;
  TrainingProgress progress() const override;
  v1::PreparePhases last_prepare() const override;
  void Warm(const Assignment& slot) override;
  v1::WarmSpare warm_status() const override;

  // For tests: the current generation's weights (null without a session),
  // to tell a kept session from a rebuilt one.
  const float* weights_for_testing();

 private:
  // One generation's resources; destroyed in reverse order.
  struct Run;

  absl::StatusOr<std::unique_ptr<GenerationComms>> NewUcxComms(const CommsRequest& request) const;
  // Communicators and (members) the session of `assignment`; the session is
  // `keep`'s when that is not null (see CanKeepSession), or `warm`'s (a warm
  // spare's, see TakeWarm), or else a new one that takes over what fits of
  // `reuse`'s (see CanReuseSession; may be null).
  absl::StatusOr<std::unique_ptr<Run>> Build(const Assignment& assignment, Run* keep, Run* warm,
                                             Run* reuse);
  // The rank's session (and the communicators it trains over, tracked),
  // built into `run` over run->comms, taking over what fits of `reuse`'s
  // session (may be null); with `memory_bound`, refused (ResourceExhausted)
  // when its estimate exceeds it.
  absl::Status BuildSession(const Assignment& assignment, Run* run,
                            std::optional<uint64_t> memory_bound, Run* reuse);
  // A warm spare's session of `slot`, over communicators that are not
  // attached to any generation (every call fails) until a Prepare of that
  // place moves it to its own (MoveSession).
  absl::StatusOr<std::unique_ptr<Run>> BuildWarm(const Assignment& slot);
  // The warm spare's thread: builds what Warm last asked for, drops what no
  // longer is.
  void WarmLoop();
  // For a Prepare of `assignment`: the session prepared ahead if it fits
  // (waiting for its build to end), else null, after releasing whatever was
  // prepared (its memory is freed before the Prepare builds).
  std::unique_ptr<Run> TakeWarm(const Assignment& assignment);
  // Whether `assignment` can train on `source`'s session as it is.
  static bool CanKeepSession(const Run& source, const Assignment& assignment);
  // Whether a new session of `assignment` may take over parts of `source`'s
  // (TrainingSessionOptions::reuse, which takes what fits: the same job).
  static bool CanReuseSession(const Run& source, const Assignment& assignment);
  // Moves the session (and the communicators it was built on, rebound to
  // `to`'s) from `from` to `to`.
  static absl::Status MoveSession(Run* from, Run* to);
  // Loads the state the plan names into the run's session; returns the step
  // to resume at.
  absl::StatusOr<int64_t> Restore(const Assignment& assignment, Run* run, Run* source);
  absl::StatusOr<int64_t> RestoreFromCheckpoint(const Assignment& assignment, Run* run,
                                                std::optional<int64_t> step);
  // The held run whose state is of `generation`, or null.
  Run* HeldRunLocked(uint64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<v1::HeldState> HeldStatesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Train(Run* run);
  // Stops the current run's training thread, keeping its state.
  void SuspendLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineTrainerOptions options_;
  std::unique_ptr<checkpoint::CheckpointMetrics> checkpoint_metrics_;
  std::unique_ptr<CommunicationMetrics> communication_metrics_;  // null without a registry
  // Starts `assignment`'s Prepare or Donate: cancelled_ says whether an
  // interrupt already covers it, and later ones of it set it.
  void BeginInterruptible(const Assignment& assignment);
  // It returned: later interrupts are only recorded.
  void EndInterruptible();
  // Interrupts the work in flight, whatever it is (Stop).
  void InterruptAll();

  // Set while the Prepare or Donate in flight has been interrupted; read by
  // the cancellable KeyValue client and the transfers.
  std::atomic<bool> cancelled_{false};
  absl::Mutex interrupt_mu_;
  // The Prepare or Donate in flight, if any.
  std::optional<std::pair<JobId, Generation>> interruptible_ ABSL_GUARDED_BY(interrupt_mu_);
  // Per job, the newest generation an interrupt has named. Entries of other
  // jobs are dropped when a Prepare or Donate begins.
  absl::flat_hash_map<JobId, Generation> interrupted_ ABSL_GUARDED_BY(interrupt_mu_);
  std::atomic<int> in_collective_{0};

  absl::Mutex mu_;  // Prepare/Suspend/Donate/Stop
  std::unique_ptr<Run> run_ ABSL_GUARDED_BY(mu_);       // the current generation
  std::unique_ptr<Run> previous_ ABSL_GUARDED_BY(mu_);  // kept until run_ trains a step

  absl::Mutex building_mu_;  // never held while waiting on mu_
  Run* building_ ABSL_GUARDED_BY(building_mu_) = nullptr;

  mutable absl::Mutex progress_mu_;
  TrainingProgress progress_ ABSL_GUARDED_BY(progress_mu_);
  // The job progress_.recent_validations belong to.
  JobId validations_job_ ABSL_GUARDED_BY(progress_mu_);
  v1::PreparePhases last_prepare_ ABSL_GUARDED_BY(progress_mu_);
  // Bytes the restore in flight received (peers or checkpoint).
  uint64_t restore_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  // The warm spare (Warm, WarmLoop, TakeWarm). Never held while waiting on
  // mu_ or building_mu_.
  mutable absl::Mutex warm_mu_;
  std::optional<Assignment> warm_wanted_ ABSL_GUARDED_BY(warm_mu_);  // the last Warm's slot
  std::optional<Assignment> warm_done_ ABSL_GUARDED_BY(warm_mu_);    // the loop's last target
  std::unique_ptr<Run> warm_ ABSL_GUARDED_BY(warm_mu_);              // built for warm_done_
  bool warm_busy_ ABSL_GUARDED_BY(warm_mu_) = false;  // the loop is dropping or building
  bool warm_exit_ ABSL_GUARDED_BY(warm_mu_) = false;
  v1::WarmSpare warm_status_ ABSL_GUARDED_BY(warm_mu_);
  std::thread warm_thread_;  // started by the first Warm
};

}  // namespace cohort::worker
