#pragma once
// WorkerProtocol: the worker's side of Workers.Attach as a state machine with
// no gRPC, no threads, no clock and no trainer calls (docs/conventions.md,
// Pure core); the counterpart of coordinator/attach_protocol.h.
//
// It owns every decision the protocol makes on the worker:
//   - which commands are stale (older than a generation already commanded
//     for their job, by this coordinator);
//   - what each command asks of the trainer, and what each status says;
//   - the held assignment and the state last reported for it;
//   - what a Welcome from another coordinator resets, and the COMPLETED it
//     says again;
//   - the statuses kept across reconnects (in order, bounded).
// WorkerAgent runs it over the gRPC stream with its threads and the real
// Trainer; the protocol simulation's SimWorker (tests/simulation) runs the
// same class on simulated time with a simulated trainer, so the simulation's
// 20,000 seeds test this code and not a copy of it.
//
// A command is taken in two halves, so that no trainer call happens inside
// the protocol (a Prepare takes seconds; the caller must not hold its lock
// over it):
//   Decide(command)  what the trainer must do, if anything;
//   the caller does it (Trainer::Prepare, Donate, Suspend, Stop, Warm);
//   Finish...(...)   the status to say, and the held state after it.
// Statuses go through Say(): kept, oldest first, until the caller has written
// them to a welcomed stream (NextPending / PopPending).
//
// Not thread-safe: the caller serialises every call (WorkerAgent under its
// mutex; SimWorker on the simulator's one thread).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "cohort/v1/workers.pb.h"
#include "common/command_target.h"
#include "worker/agent/trainer.h"

namespace cohort::worker {

// What a command asks of the caller, from WorkerProtocol::Decide.
struct CommandDecision {
  enum class Kind {
    kNothing,        // stale or ignored: nothing to do, nothing to say
    kSay,            // say `status` now; the trainer does nothing
    kSayHeldStates,  // a repeat of a generation held suspended: say `status`
                     // with the held states Trainer::Suspend() returns
    kPrepare,        // Trainer::Stop() first when `stop_first`; then Hold,
                     // Trainer::Prepare(assignment), FinishPrepare
    kDonate,         // Hold, Trainer::Donate(assignment), FinishDonate
    kSuspend,        // Trainer::Suspend(), FinishSuspend
    kStop,           // Trainer::Stop() when `stop_trainer`, FinishStop
    kWarm,           // Trainer::Warm(assignment)
    kDrain,          // Trainer::Stop(), FinishDrain; no command runs after it
  };
  Kind kind = Kind::kNothing;
  // kPrepare and kDonate: what to prepare or donate; kWarm: the place the
  // WarmUp names (an empty job id: release the warm session).
  Assignment assignment;
  // kPrepare: another job is held and no Stop came for it first.
  bool stop_first = false;
  // kStop: the job is held, so the trainer stops it.
  bool stop_trainer = false;
  // kSay and kSayHeldStates.
  v1::AssignmentStatus status;
  // kDonate: set when this worker is not among the plan's donors; the
  // caller finishes with it instead of calling the trainer.
  absl::Status donate_refused;
  // kNothing: why a command was ignored, where a person would want to know
  // (a WarmUp while holding a job); empty for a stale command.
  std::string why;
};

// How a Prepare ended, for what the caller does next.
enum class PrepareOutcome {
  kReady,     // prepared: say READY
  kCutShort,  // a peer or the coordinator went away (Unavailable, Aborted,
              // Cancelled, DeadlineExceeded): not the job's failure; the
              // caller asks Trainer::Suspend() for the states it keeps
  kFailed,    // the job cannot run here: the caller calls Trainer::Stop()
};
PrepareOutcome PrepareOutcomeOf(const absl::Status& prepared);

// The (job, generation) whose Prepare or Donate an arriving `message`
// interrupts at once (Trainer::Interrupt), from the thread that reads the
// stream rather than in the command queue: a Suspend's or a Stop's. Not
// filtered by what is held, since the message may overtake the Prepare it is
// meant for (the trainer keeps the interrupt for it).
std::optional<CommandTarget> InterruptTargetOf(const v1::CoordinatorMessage& message);

class WorkerProtocol {
 public:
  // Undelivered statuses kept across reconnects; older ones are dropped first.
  static constexpr size_t kMaxPendingStatuses = 16;
  // Jobs whose newest commanded generation is remembered; beyond it another
  // job is forgotten (its commands are long gone).
  static constexpr size_t kMaxRememberedJobs = 64;

  // `worker_id`: this worker's id, named in the messages it says.
  explicit WorkerProtocol(std::string worker_id);

  // --- the stream ---
  const std::optional<Assignment>& held() const { return held_; }
  // The state last reported for held() (UNSPECIFIED while preparing).
  v1::AssignmentState held_state() const { return held_state_; }
  // What a Hello says is held; nullopt when nothing is.
  std::optional<v1::HeldAssignment> HeldForHello() const;
  // A Welcome arrived. Another coordinator (another id; an empty data
  // directory may reuse job ids) starts the generations and WarmUp sequences
  // afresh. A COMPLETED of the held assignment is said again unless one is
  // still pending: it may have gone out on a stream whose coordinator died
  // unread, which would leave the job running at its last step forever.
  // `progress`: the trainer's, for that status.
  void OnWelcome(const v1::Welcome& welcome, const v1::Progress& progress);

  // --- commands ---
  // A message of the coordinator's that is a command (Assign, Reconfigure,
  // Suspend, Stop, WarmUp, Drain) is queued in arrival order; any other is
  // ignored. Before it, the caller interrupts what InterruptTargetOf names.
  void Receive(const v1::CoordinatorMessage& message);
  bool HasCommand() const { return !commands_.empty(); }
  // The next queued command that is not stale (older than a generation
  // already commanded for its job, even with nothing held: a donor that
  // handed its state over, a stopped member); nullopt when none is left.
  std::optional<v1::CoordinatorMessage> NextCommand();
  // What `command` (from NextCommand) asks for. Updates the held state where
  // no trainer call comes between (a repeat, a Stop of a job not held).
  CommandDecision Decide(const v1::CoordinatorMessage& command);

  // The assignment the trainer now works on, state UNSPECIFIED: before
  // Trainer::Prepare or Donate, so that heartbeats name it and a late
  // Suspend or Stop of the generation it leaves is stale.
  void Hold(const Assignment& assignment);
  // After Trainer::Prepare(assignment) returned `prepared` (and, as its
  // PrepareOutcome asks, Trainer::Suspend() gave `kept`, or Trainer::Stop()
  // ran). `phases`: Trainer::last_prepare(), sent with READY.
  v1::AssignmentStatus FinishPrepare(const Assignment& assignment, const absl::Status& prepared,
                                     const std::vector<v1::HeldState>& kept,
                                     const v1::PreparePhases& phases);
  // After Trainer::Donate(assignment). A failed donation keeps the source
  // state (EngineTrainer::Donate): held as SUSPENDED, for the next re-plan.
  v1::AssignmentStatus FinishDonate(const Assignment& assignment, const absl::Status& donated);
  // After Trainer::Suspend() gave `kept`.
  v1::AssignmentStatus FinishSuspend(const v1::Suspend& suspend,
                                     const std::vector<v1::HeldState>& kept);
  // After Trainer::Stop() (when the decision said so): RELEASED.
  v1::AssignmentStatus FinishStop(const v1::Stop& stop);
  // After Trainer::Stop(): RELEASED for the assignment held, if any.
  std::optional<v1::AssignmentStatus> FinishDrain(const v1::Drain& drain);

  // --- the trainer's own reports ---
  // Training of (job, generation) ended by itself: OK is COMPLETED, anything
  // else FAILED. nullopt when the assignment has changed since.
  std::optional<v1::AssignmentStatus> TrainingFinished(const JobId& job, Generation generation,
                                                       const absl::Status& status);
  // Training of (job, generation) stopped because a peer failed; the trainer
  // keeps `kept`. SUSPENDED, naming the worker behind the peer `why` names
  // (comm::FailedPeer) as unreachable; nullopt when the assignment changed.
  std::optional<v1::AssignmentStatus> TrainingSuspended(const JobId& job, Generation generation,
                                                        const std::vector<v1::HeldState>& kept,
                                                        const absl::Status& why);

  // --- statuses ---
  // Keeps `status` to be written; at most kMaxPendingStatuses, the oldest
  // dropped first (logged). Returns false when one was dropped.
  bool Say(v1::AssignmentStatus status);
  // The oldest status not yet written (nullptr: none). Pop it once it has
  // been written; a failed write leaves it for the next stream.
  const v1::AssignmentStatus* NextPending() const;
  void PopPending();
  size_t pending_count() const { return pending_.size(); }

 private:
  CommandDecision DecideAssign(const v1::Assign& assign);
  CommandDecision DecideReconfigure(const v1::Reconfigure& reconfigure);
  CommandDecision DecideStop(const v1::Stop& stop);
  CommandDecision DecideSuspend(const v1::Suspend& suspend);
  CommandDecision DecideWarmUp(const v1::WarmUp& warm);
  // Records `command`'s generation for its job; true when it is older than
  // one already recorded.
  bool IsStale(const v1::CoordinatorMessage& command);

  const std::string worker_id_;
  std::string coordinator_id_;
  // The newest generation commanded per job, by the current coordinator.
  absl::flat_hash_map<std::string, uint64_t> newest_generation_;
  // WarmUp.sequence of the last WarmUp applied (0 with a new coordinator).
  uint64_t last_warm_sequence_ = 0;
  std::optional<Assignment> held_;
  v1::AssignmentState held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  std::deque<v1::CoordinatorMessage> commands_;
  std::deque<v1::AssignmentStatus> pending_;
};

// A status of (job, generation) in `state`, with no progress yet (the
// caller adds the trainer's).
v1::AssignmentStatus NewStatus(const JobId& job, Generation generation, v1::AssignmentState state,
                               const std::string& message = "",
                               const std::vector<v1::HeldState>& held = {});

}  // namespace cohort::worker
