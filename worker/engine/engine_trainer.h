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
// The parts, each with its own contract (this class orchestrates them):
//   SessionBuilder  a generation's communicators and session: kept, a warm
//                   spare's, or new around what fits (session_builder.h)
//   StateRestorer   the state the plan names (state_restorer.h)
//   SessionCache    the generations held for peer recovery (session_cache.h)
//   WarmSpare       the session prepared ahead (warm_spare.h)
//   GenerationRun   one generation's resources and training thread, which
//                   runs RunTrainingLoop (generation_run.h, training_loop.h)
//   InterruptGate   interrupts that reach the Prepare or Donate they name,
//                   before or while it runs (interrupt_gate.h)
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

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/agent/trainer.h"
#include "worker/checkpoint/checkpoint_metrics.h"
#include "worker/engine/engine_trainer_options.h"
#include "worker/engine/generation_run.h"
#include "worker/engine/interrupt_gate.h"
#include "worker/engine/session_builder.h"
#include "worker/engine/session_cache.h"
#include "worker/engine/state_restorer.h"
#include "worker/engine/warm_spare.h"

namespace cohort::worker {

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
  // Which sessions a Prepare builds on (SessionBuilder::Build's keep, warm
  // and reuse).
  struct SessionChoice {
    GenerationRun* source = nullptr;      // the held run of the plan's source generation
    GenerationRun* keep = nullptr;        // the source, when its session fits as it is
    std::unique_ptr<GenerationRun> warm;  // the warm spare's run, when it fits
    bool warm_fits = false;               // as it is (else reuse is warm)
    GenerationRun* reuse = nullptr;       // a session whose model shard may fit
  };
  // When a Prepare's phases ended.
  struct PrepareTimes {
    absl::Time start, built, restored, mirrored;
  };

  SessionChoice ChooseSessionsLocked(const Assignment& assignment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resets the progress to the step `assignment` resumes at (keeping the
  // job's validations).
  void BeginProgress(const Assignment& assignment);
  void RecordPrepare(const GenerationRun& run, const PrepareTimes& times, uint64_t restore_bytes,
                     bool session_kept, bool model_kept);
  // The callbacks of a run's training thread: progress and the agent's.
  GenerationRunCallbacks RunCallbacks();

  const EngineTrainerOptions options_;
  const std::unique_ptr<checkpoint::CheckpointMetrics>
      checkpoint_metrics_;  // null without a registry
  InterruptGate interrupts_;
  // Outlives every run (their communicators count into it).
  SessionBuilder builder_;
  const StateRestorer restorer_;

  absl::Mutex mu_;  // Prepare/Suspend/Donate/Stop
  SessionCache held_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex progress_mu_;
  TrainingProgress progress_ ABSL_GUARDED_BY(progress_mu_);
  // The job progress_.recent_validations belong to.
  JobId validations_job_ ABSL_GUARDED_BY(progress_mu_);
  v1::PreparePhases last_prepare_ ABSL_GUARDED_BY(progress_mu_);

  // Destroyed first: its thread builds through builder_.
  WarmSpare warm_;
};

}  // namespace cohort::worker
