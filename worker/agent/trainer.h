#pragma once
// Trainer: the seam between the worker agent (membership, commands) and the
// training engine (model, communicators, steps). The agent owns the protocol;
// the trainer owns the work.

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "cohort/v1/job.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"

namespace cohort::worker {

// One generation of one job, as this worker holds it.
struct Assignment {
  JobId job_id;
  Generation generation;
  v1::JobSpec spec;  // from the Assign; a Reconfigure keeps the held spec
  v1::Mesh mesh;
  v1::MeshCoordinates coordinates;  // this worker's place in `mesh` (members)
  v1::RecoveryPlan recovery;        // where the generation's state comes from
  bool donor = false;               // serves state to `mesh`, is not in it
  // This worker's index among the transfer's participants: its rank in
  // `mesh`, or (donors) the mesh size plus its index in recovery.donors.
  int participant = 0;
};

// Steps over which TrainingProgress::tokens_per_second_average is taken.
inline constexpr int kRateWindowSteps = 20;

// Validation results a worker repeats in its progress reports, so that one
// lost or ignored report (a generation change) loses none of them.
inline constexpr int kRecentValidations = 8;

struct ValidationPoint {
  Step step{0};
  double loss = 0;
};

// What the trainer has done so far for the current assignment.
struct TrainingProgress {
  Step step{0};                // optimizer steps completed
  std::optional<double> loss;  // loss of the last step; absent before the first
  double tokens_per_second = 0;          // of the last step
  double tokens_per_second_average = 0;  // over the last kRateWindowSteps steps
  double step_time_seconds = 0;
  bool waiting_for_peers = false;  // inside a collective right now
  // The job's last kRecentValidations validations, oldest first (kept
  // across the job's generations on this worker).
  std::vector<ValidationPoint> recent_validations;
};

// Implementations must be thread-safe: the agent calls Prepare, Suspend,
// Donate and Stop from its command thread, progress() from its heartbeat
// thread, Interrupt from its reader thread, and Stop from its run thread at
// shutdown (possibly while Prepare is in flight).
class Trainer {
 public:
  virtual ~Trainer() = default;

  // Makes the trainer ready to run `assignment`: called on Assign (a new job)
  // and on Reconfigure (the held job's next generation, which replaces the
  // current one). Returns OK once ready to train that generation; an error
  // (with a message an operator can act on) if it cannot, in which case the
  // trainer holds nothing. Must give up promptly (Cancelled) when Stop is
  // called concurrently.
  // An error that means a peer or the coordinator went away (Unavailable,
  // Aborted, Cancelled, DeadlineExceeded) leaves the state held before the
  // call untouched, to be reported by the next Suspend.
  virtual absl::Status Prepare(const Assignment& assignment) = 0;

  // Stops training the current generation but keeps its state in memory;
  // returns the consistent states held, newest first (empty: none).
  virtual std::vector<v1::HeldState> Suspend() = 0;

  // Makes an in-flight Prepare or Donate of `job` at a generation <=
  // `generation` give up promptly (Cancelled), so a Suspend or Stop that
  // just arrived can run; one that starts later gives up at once. The agent
  // calls it as the Suspend or Stop arrives, which may be before it has
  // even begun the Prepare the message is meant to interrupt: an interrupt
  // must never be undone by the Prepare starting after it. From any thread.
  virtual void Interrupt(const JobId& job, Generation generation) = 0;

  // As a donor of `assignment` (assignment.donor): serves this worker's
  // pieces of the held state to the new mesh, then drops all state.
  virtual absl::Status Donate(const Assignment& assignment) = 0;

  // Stops all work on the current assignment and releases it. Idempotent;
  // a no-op when nothing is held.
  virtual void Stop() = 0;

  // Progress of the current assignment (zero values when none).
  virtual TrainingProgress progress() const = 0;
  // Where the last successful Prepare's time went (sent with READY); zeros
  // from trainers that do not measure it.
  virtual v1::PreparePhases last_prepare() const { return {}; }

  // As a spare of a running job (WarmUp), prepares `slot`'s session ahead,
  // in the background (never blocks on it); an empty job id releases what
  // was prepared. A later Prepare of a place with the same shapes takes it;
  // any other Prepare releases it first. Trainers that cannot prepare ahead
  // ignore it.
  virtual void Warm(const Assignment& slot) {}
  // What Warm has prepared (state UNSPECIFIED: nothing asked).
  virtual v1::WarmSpare warm_status() const { return {}; }
};

}  // namespace cohort::worker
