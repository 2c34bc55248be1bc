#pragma once
// Trainer: the seam between the worker agent (membership, commands) and the
// training engine (model, communicators, steps). The agent owns the protocol;
// the trainer owns the work.

#include <optional>

#include "absl/status/status.h"
#include "cohort/v1/job.pb.h"
#include "common/ids.h"

namespace cohort::worker {

// One generation of one job, as this worker holds it.
struct Assignment {
  JobId job_id;
  Generation generation;
  v1::JobSpec spec;  // from the Assign; a Reconfigure keeps the held spec
  v1::Mesh mesh;
  v1::MeshCoordinates coordinates;  // this worker's place in `mesh`
};

// What the trainer has done so far for the current assignment.
struct TrainingProgress {
  Step step{0};                // optimizer steps completed
  std::optional<double> loss;  // loss of the last step; absent before the first
  double tokens_per_second = 0;
  double step_time_seconds = 0;
};

// Implementations must be thread-safe: the agent calls Prepare and Stop from
// its command thread, progress() from its heartbeat thread, and Stop from its
// run thread at shutdown (possibly while Prepare is in flight).
class Trainer {
 public:
  virtual ~Trainer() = default;

  // Makes the trainer ready to run `assignment`: called on Assign (a new job)
  // and on Reconfigure (the held job's next generation, which replaces the
  // current one). Returns OK once ready to train that generation; an error
  // (with a message an operator can act on) if it cannot, in which case the
  // trainer holds nothing. Must give up promptly (Cancelled) when Stop is
  // called concurrently.
  virtual absl::Status Prepare(const Assignment& assignment) = 0;

  // Stops all work on the current assignment and releases it. Idempotent;
  // a no-op when nothing is held.
  virtual void Stop() = 0;

  // Progress of the current assignment (zero values when none).
  virtual TrainingProgress progress() const = 0;
};

}  // namespace cohort::worker
