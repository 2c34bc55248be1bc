#pragma once
// The training loop of one generation, apart from how the generation was
// built (EngineTrainer builds communicators, the session and the writer,
// restores the state, then runs this on its training thread): steps from
// `start_step` to `steps`, a checkpoint after every `checkpoint_interval`-th
// step and after the last, a validation where the job asks for one (its
// interval and the last step), one loss-log line per step and per
// validation, and how the loop
// ended, which EngineTrainer turns into on_finished / on_suspended. Runs
// over any communicators the session was built on, so tests drive it with
// fakes (tests/unit/worker/training_loop_test.cc).
//
// Not thread-safe: one call per generation, on one thread; `stop` may be set
// from any thread.

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/ids.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/train/step_runner.h"
#include "worker/train/training_session.h"

namespace cohort::worker {

struct TrainingLoopInput {
  JobId job;
  Generation generation;
  train::TrainingSession* session = nullptr;
  int64_t start_step = 0;  // the step the state was restored at
  int64_t steps = 0;       // the job's total
  // Checkpoints when set (and checkpoint_interval > 0): the rank's share of
  // the state, its optimizer range being `optimizer`.
  checkpoint::CheckpointWriter* writer = nullptr;
  int64_t checkpoint_interval = 0;
  checkpoint::ArenaRange optimizer;
  // One line per completed step when set (EngineTrainerOptions::loss_log).
  std::FILE* loss_log = nullptr;
  // Set to end the loop between steps (a Suspend, a Stop, a new Prepare);
  // the communicators are aborted at the same time to end a step in flight.
  const std::atomic<bool>* stop = nullptr;
  // Times the steps and validations and the loss log's lines; must outlive
  // the call.
  const Clock* clock = RealClock::Get();
};

struct TrainingLoopHooks {
  // After every completed step (the step number counts completed steps).
  std::function<void(Step done, const train::StepResult& result, absl::Duration took)> on_step;
  // After every validation (TrainingConfig::ValidatesAfter): the step it
  // followed and the validation loss.
  std::function<void(Step done, double loss, absl::Duration took)> on_validation;
  // After every checkpoint taken: how long the loop was blocked by it.
  std::function<void(absl::Duration stall)> on_checkpoint;
};

enum class TrainingLoopEnd {
  kCompleted,  // every step done, the final checkpoint in (or failed, logged)
  kStopped,    // `stop` was set, or a step was aborted
  kPeerLost,   // a collective found a peer gone (Unavailable, DeadlineExceeded)
  kFailed,     // a step failed otherwise
};

struct TrainingLoopOutcome {
  TrainingLoopEnd end = TrainingLoopEnd::kCompleted;
  absl::Status status;     // kPeerLost and kFailed: the step's error
  int64_t steps_done = 0;  // steps completed by this call
  // kPeerLost: the newest state version the session keeps (-1: none), what
  // the survivors report holding.
  int64_t newest_state = -1;
};

TrainingLoopOutcome RunTrainingLoop(const TrainingLoopInput& input,
                                    const TrainingLoopHooks& hooks);

}  // namespace cohort::worker
