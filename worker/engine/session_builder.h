#pragma once
// SessionBuilder: builds a generation's GenerationRun: its communicators
// (EngineTrainerOptions::comms_factory, UCX by default), its checkpoint
// client and loss log and, for a member, the rank's TrainingSession, which
// is one of
//   kept    the source generation's session as it is (CanKeepSession): the
//           same job spec, layout and coordinates; only communicators are
//           built, and the session is rebound to them (MoveSession)
//   warm    a warm spare's session of the same place, taken the same way
//   new     built for the rank's layout, taking over what fits of a
//           `reuse` session (TrainingSessionOptions::reuse: the model shard
//           when only the data rank or the data degree changed)
// It also builds a warm spare's session over communicators attached to no
// generation (BuildWarm) and the checkpoint writer of a restored run.
//
// The sessions' tracked communicators count the collectives in flight
// (in_collective(), the progress's waiting_for_peers), report to the
// communication metrics (with options.registry) and are watched by the
// builder's call watchdog (options.collective_watchdog_grace), which aborts
// the run that holds them (GenerationRun::watched) when a call overruns.
//
// Thread-safe: Build and BuildWarm may run at once (a Prepare and the warm
// spare's thread); each run is its caller's. The options, the interrupt gate
// and the metrics must outlive the builder, and the builder every run it
// built (their communicators count into it).

#include <atomic>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/agent/trainer.h"
#include "worker/checkpoint/checkpoint_metrics.h"
#include "worker/comm/call_watchdog.h"
#include "worker/engine/communication_metrics.h"
#include "worker/engine/engine_trainer_options.h"
#include "worker/engine/generation_run.h"
#include "worker/engine/interrupt_gate.h"

namespace cohort::worker {

class SessionBuilder {
 public:
  // `interrupts` (may be null) cancels a build in flight; `checkpoint_metrics`
  // (may be null) observes the writers' uploads.
  SessionBuilder(const EngineTrainerOptions& options, InterruptGate* interrupts,
                 checkpoint::CheckpointMetrics* checkpoint_metrics);

  // Communicators and (members) the session of `assignment`; the session is
  // `keep`'s when that is not null (see CanKeepSession), or `warm`'s (a warm
  // spare's), or else a new one that takes over what fits of `reuse`'s (see
  // CanReuseSession; may be null). Errors: the factory's, the spec's, the
  // loss log's (FailedPrecondition), the session's.
  absl::StatusOr<std::unique_ptr<GenerationRun>> Build(const Assignment& assignment,
                                                       GenerationRun* keep, GenerationRun* warm,
                                                       GenerationRun* reuse);

  // A warm spare's session of `slot`, over communicators that are not
  // attached to any generation (every call fails) until a Build of that
  // place takes it; ResourceExhausted when its estimate exceeds
  // options.warm_memory_bytes.
  absl::StatusOr<std::unique_ptr<GenerationRun>> BuildWarm(const Assignment& slot);

  // Gives a restored member `run` its checkpoint writer, when its job
  // checkpoints.
  void AddCheckpointWriter(const Assignment& assignment, GenerationRun* run) const;

  // Whether `assignment` can train on `source`'s session as it is.
  static bool CanKeepSession(const GenerationRun& source, const Assignment& assignment);
  // Whether a new session of `assignment` may take over parts of `source`'s
  // (TrainingSessionOptions::reuse, which takes what fits: the same job).
  static bool CanReuseSession(const GenerationRun& source, const Assignment& assignment);
  // The same place's shapes (job, spec, layout, rank): what a warm spare's
  // session fits (CanKeepSession, between two places).
  static bool SamePlace(const Assignment& a, const Assignment& b);
  // Moves the session (and the communicators it was built on, rebound to
  // `to`'s) from `from` to `to`.
  static absl::Status MoveSession(GenerationRun* from, GenerationRun* to);

  // Whether a session it built is inside a collective right now.
  bool in_collective() const { return in_collective_.load() > 0; }

 private:
  absl::StatusOr<std::unique_ptr<GenerationComms>> NewUcxComms(const CommsRequest& request) const;
  // The rank's session (and the communicators it trains over, tracked),
  // built into `run` over run->comms, taking over what fits of `reuse`'s
  // session (may be null); with `memory_bound`, refused (ResourceExhausted)
  // when its estimate exceeds it.
  absl::Status BuildSession(const Assignment& assignment, GenerationRun* run,
                            std::optional<uint64_t> memory_bound, GenerationRun* reuse);

  const EngineTrainerOptions& options_;
  InterruptGate* const interrupts_;
  checkpoint::CheckpointMetrics* const checkpoint_metrics_;
  std::unique_ptr<CommunicationMetrics> communication_metrics_;  // null without a registry
  std::atomic<int> in_collective_{0};
  comm::CallWatchdog watchdog_;
};

}  // namespace cohort::worker
