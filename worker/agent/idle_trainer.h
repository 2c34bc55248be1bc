#pragma once
// IdleTrainer: accepts assignments, reports them ready and does no work
// (`cohort-worker --trainer idle`): a worker joins meshes and follows
// commands, holds no state, its step stays 0 and it reports no loss. For
// control-plane tests and failure drills.

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/agent/trainer.h"

namespace cohort::worker {

// Thread-safe.
class IdleTrainer : public Trainer {
 public:
  // Always OK: there is nothing to set up.
  absl::Status Prepare(const Assignment& assignment) override;
  // Nothing is held.
  std::vector<v1::HeldState> Suspend() override { return {}; }
  void Interrupt(const JobId&, Generation) override {}
  // Nothing to serve; drops the assignment.
  absl::Status Donate(const Assignment& assignment) override;
  void Stop() override;
  // Always step 0, no loss.
  TrainingProgress progress() const override { return TrainingProgress{}; }

  // The assignment accepted by the last Prepare, until Stop.
  std::optional<Assignment> current() const;

 private:
  mutable absl::Mutex mu_;
  std::optional<Assignment> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::worker
