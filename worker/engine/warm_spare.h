#pragma once
// WarmSpare: the session an idle worker prepares ahead for the place of a
// running job the coordinator names (Trainer::Warm), so that a Prepare of
// that place builds only communicators.
//
// Warm(slot) asks for `slot`'s place (an empty job id: for nothing); a
// background thread, started by the first Warm, drops what no longer is
// wanted (its memory goes back first) and builds what is, through `build`
// (SessionBuilder::BuildWarm). A Warm of the same place in a newer
// generation (SessionBuilder::SamePlace) keeps what was prepared. status()
// says what it holds: WARMING while building, WARM with the session's
// estimated bytes, COLD with the reason it could not (or, with a memory
// bound of 0, that preparing ahead is off), nothing when nothing is wanted.
//
// Take(assignment) is a Prepare's: it waits for a build in flight, hands
// over the prepared run if its session fits `assignment` (the same place, or
// a place whose model shard it holds, SessionBuilder::CanReuseSession and
// TrainingSession::ModelFitsFor) and releases it otherwise, and forgets the
// slot: the worker never holds two sessions.
//
// Thread-safe. `build` runs on the background thread without the lock.

#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cohort/v1/workers.pb.h"
#include "worker/agent/trainer.h"
#include "worker/engine/generation_run.h"

namespace cohort::worker {

class WarmSpare {
 public:
  using BuildFn =
      std::function<absl::StatusOr<std::unique_ptr<GenerationRun>>(const Assignment& slot)>;

  // `memory_bytes` 0: never prepare ahead (EngineTrainerOptions::warm_memory_bytes).
  WarmSpare(uint64_t memory_bytes, BuildFn build);
  // Waits for a build in flight, then releases what it holds.
  ~WarmSpare();
  WarmSpare(const WarmSpare&) = delete;
  WarmSpare& operator=(const WarmSpare&) = delete;

  void Warm(const Assignment& slot);
  v1::WarmSpare status() const;
  // The prepared run if it fits `assignment`, else null (see above).
  std::unique_ptr<GenerationRun> Take(const Assignment& assignment);

 private:
  // The background thread: builds what Warm last asked for, drops what no
  // longer is.
  void Loop();

  const uint64_t memory_bytes_;
  const BuildFn build_;
  mutable absl::Mutex mu_;
  std::optional<Assignment> wanted_ ABSL_GUARDED_BY(mu_);     // the last Warm's slot
  std::optional<Assignment> done_ ABSL_GUARDED_BY(mu_);       // the loop's last target
  std::unique_ptr<GenerationRun> warm_ ABSL_GUARDED_BY(mu_);  // built for done_
  bool busy_ ABSL_GUARDED_BY(mu_) = false;                    // the loop is dropping or building
  bool exit_ ABSL_GUARDED_BY(mu_) = false;
  v1::WarmSpare status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // started by the first Warm (under mu_)
};

}  // namespace cohort::worker
