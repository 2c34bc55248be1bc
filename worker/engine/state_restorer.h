#pragma once
// StateRestorer: loads the state a generation's recovery plan names into
// its run's session, and returns the step it trains from:
//
//   PEER        from the previous generation's members' memory (this
//               worker's own `source` run included), box by box over the
//               run's world communicator (worker/checkpoint/state_transfer.h),
//               into any layout; a donor (a run without a session) only
//               serves
//   CHECKPOINT  from the checkpoint the plan names (or the newest, should
//               retention have replaced it), re-sharded
//   NONE        the job's newest checkpoint if any, else
//               checkpoint.resume_from_job's, else the initial weights
//               (checkpoint.init_from's file, or the session's own draw)
//
// Errors: FailedPrecondition for a missing resume_from_job checkpoint, an
// init_from file that cannot be read or a checkpoint of another model;
// DataLoss for a corrupt checkpoint; Unavailable or DeadlineExceeded when a
// peer or the coordinator failed during the transfer; Aborted or Cancelled
// when the run's communicators were aborted.
//
// Thread-safe: it keeps no state of its own; the runs are the caller's, and
// the options and metrics must outlive it. Times what it does by
// options.clock.

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "worker/agent/trainer.h"
#include "worker/checkpoint/checkpoint_metrics.h"
#include "worker/engine/engine_trainer_options.h"
#include "worker/engine/generation_run.h"

namespace cohort::worker {

struct RestoredState {
  int64_t step = 0;    // the step the run resumes at
  uint64_t bytes = 0;  // received from peers, or downloaded from a checkpoint
};

class StateRestorer {
 public:
  // `metrics` (may be null) records restores and transfers.
  StateRestorer(const EngineTrainerOptions& options, checkpoint::CheckpointMetrics* metrics);

  // Loads what `assignment`'s plan names into `run` (built for it); a peer
  // plan serves from `source` (may be null: this worker holds nothing of
  // the source generation).
  absl::StatusOr<RestoredState> Restore(const Assignment& assignment, GenerationRun* run,
                                        GenerationRun* source) const;

 private:
  // A plan without peers: the checkpoint of `step` (the newest when absent),
  // or where the job starts.
  absl::StatusOr<RestoredState> RestoreFromCheckpoint(const Assignment& assignment,
                                                      GenerationRun* run,
                                                      std::optional<int64_t> step) const;

  const EngineTrainerOptions& options_;
  checkpoint::CheckpointMetrics* const metrics_;
};

}  // namespace cohort::worker
