#pragma once
// SessionCache: the generations whose sessions this worker holds, for peer
// recovery: the current one (training, suspended or done) and the one it
// took its state from, kept until the current one has trained a step, so
// that a failure during a recovery can still be recovered from the older
// state. A kept session (SessionBuilder::CanKeepSession) moves into the new
// generation and holds the older generations' state too (also_holds) until
// that one trains.
//
// What it answers: which held run has the state of a generation (Find),
// and what the worker reports holding (HeldStates, newest first). What it
// does: installs a newly prepared run, deciding what stays (Install), halts
// the current run's thread (Suspend) and drops everything (Clear).
//
// Not thread-safe: EngineTrainer guards it with its mutex. The training
// thread of the current run reads only its own run (and, through the
// session's on_first_update hook, the previous run's versions).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "cohort/v1/workers.pb.h"
#include "worker/engine/generation_run.h"

namespace cohort::worker {

class SessionCache {
 public:
  SessionCache() = default;
  SessionCache(const SessionCache&) = delete;
  SessionCache& operator=(const SessionCache&) = delete;

  // The current generation's run, or null.
  GenerationRun* current() const { return current_.get(); }

  // The held run whose state is of `generation`, or null.
  GenerationRun* Find(uint64_t generation) const;

  // The consistent states held: each run's newest version, for its own
  // generation and (until it trains) those it also holds.
  std::vector<v1::HeldState> HeldStates() const;

  // Makes `run` the current generation. `source` (a held run, or null) is
  // the run whose state it was restored from; it stays until `run` has
  // trained, unless `run` kept its session (nothing is left of it). Every
  // other held run is released. `shares_model` (null, or `source`) is the
  // source whose model shard `run`'s session was built around: its weights
  // count as held only until `run`'s first update changes them. Returns
  // `run`.
  GenerationRun* Install(std::unique_ptr<GenerationRun> run, GenerationRun* source,
                         bool session_kept, GenerationRun* shares_model);

  // Halts the current run's thread, keeping its state; once it has
  // trained, the older state is obsolete and released.
  void Suspend(const absl::Status& reason);

  // Halts the current run and releases every held run.
  void Clear(const absl::Status& reason);

 private:
  std::unique_ptr<GenerationRun> current_;
  std::unique_ptr<GenerationRun> previous_;  // kept until current_ trains a step
};

}  // namespace cohort::worker
