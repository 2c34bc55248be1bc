#pragma once
// InterruptGate: makes an interrupt (Trainer::Interrupt, Stop) reach the
// Prepare or Donate it is meant for, whether it arrives while that call is
// in flight or before it begins (issue 22: the agent runs Prepare on its
// command thread, while the Suspend that follows is seen at once on its
// reader thread).
//
// A Prepare or Donate brackets itself with Begin and End. Interrupt(job, g)
// covers every call of `job` at a generation <= g: one in flight is
// cancelled at once (cancelled() becomes true, and the run it is building or
// restoring, SetBuilding's, has its communicators aborted with Cancelled);
// one that begins later starts cancelled. Interrupts of other jobs are
// dropped when a call begins.
//
// Thread-safe. The building run must stay alive until SetBuilding(nullptr).

#include <atomic>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/ids.h"
#include "worker/agent/trainer.h"
#include "worker/engine/generation_run.h"

namespace cohort::worker {

class InterruptGate {
 public:
  // `assignment`'s Prepare or Donate begins: cancelled() says whether an
  // interrupt already covers it, and later ones of it set it.
  void Begin(const Assignment& assignment);
  // It returned: later interrupts are only recorded.
  void End();
  // See above.
  void Interrupt(const JobId& job, Generation generation);
  // Interrupts the work in flight, whatever it is (Stop).
  void InterruptAll();
  // The run the call in flight builds or restores into (null: none).
  void SetBuilding(GenerationRun* run);

  bool cancelled() const { return cancelled_.load(); }
  // Read by the communicators' bootstrap and the transfers while they wait.
  const std::atomic<bool>* cancelled_flag() const { return &cancelled_; }

 private:
  // Set while the call in flight has been interrupted.
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  // The Prepare or Donate in flight, if any.
  std::optional<std::pair<JobId, Generation>> in_flight_ ABSL_GUARDED_BY(mu_);
  // Per job, the newest generation an interrupt has named.
  absl::flat_hash_map<JobId, Generation> interrupted_ ABSL_GUARDED_BY(mu_);
  // Never held while taking mu_.
  absl::Mutex building_mu_;
  GenerationRun* building_ ABSL_GUARDED_BY(building_mu_) = nullptr;
};

}  // namespace cohort::worker
