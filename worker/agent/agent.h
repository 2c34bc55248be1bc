#pragma once
// WorkerAgent: the worker's side of Workers.Attach (proto/cohort/v1/workers.proto).
//
// Session protocol, as the coordinator expects it:
//   worker                                  coordinator
//   Hello{id, host, device, incarnation, held} -->
//                                      <-- Welcome{heartbeat interval, timeout}
//   Heartbeat{seq, job, generation, progress} -->   (every interval)
//                                      <-- HeartbeatAck{seq}
//                                      <-- Assign / Reconfigure
//   trainer.Prepare, then AssignmentStatus{READY | FAILED} -->
//     (a Prepare cut short by a peer or an interrupt: SUSPENDED + held states)
//                                      <-- Reconfigure as a donor
//   trainer.Donate, then AssignmentStatus{DONATED} -->
//     (with an error message when the donation failed; the state is kept)
//                                      <-- Suspend (a re-plan begins)
//   trainer.Suspend, AssignmentStatus{SUSPENDED, held states} -->
//   (a member whose step broke because a peer failed sends SUSPENDED on its own)
//                                      <-- Stop
//   trainer.Stop, AssignmentStatus{RELEASED} -->
//                                      <-- Drain
//   trainer.Stop, RELEASED for the held assignment, Leave, half-close; Run() returns OK.
// Every WorkerMessage carries the process incarnation.
//
// The coordinator being away is not a failure of the worker: when the stream
// breaks, Attach is refused, no Welcome comes, or nothing arrives for longer than
// the Welcome's heartbeat timeout, the agent keeps its assignment and trainer
// running and re-attaches with exponential backoff, sending the held
// (job, generation, coordinates) in its Hello. A status that could not be
// written (stream down) is re-sent after the next Welcome.
//
// Commands of an older generation of the held job are ignored. A repeated
// Assign/Reconfigure of the held generation is answered with the held state
// without preparing again. Stop of a job not held is answered RELEASED;
// Reconfigure of a job not held is answered FAILED.
//
// Threads: Run() owns the attach loop and sends heartbeats; per stream one
// reader thread; one command thread executes Assign/Reconfigure/Suspend/Stop/
// Drain in arrival order (so a slow Prepare never delays heartbeats). A Suspend
// or Stop also interrupts, from the reader thread, the Prepare or Donate it
// is meant for (Trainer::Interrupt), even one still queued. Writes to a stream
// are serialised by the stream's mutex.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "common/clock.h"
#include "common/ids.h"
#include "prometheus/registry.h"
#include "worker/agent/attach_stream.h"
#include "worker/agent/backoff.h"
#include "worker/agent/trainer.h"
#include "worker/agent/worker_metrics.h"

namespace cohort::worker {

// Who this worker is, as announced in every Hello.
struct WorkerIdentity {
  std::string worker_id;
  std::string host;
  v1::DeviceKind device_kind = v1::DEVICE_KIND_CPU;
  int32_t device_index = 0;
  v1::Capabilities capabilities;
  std::string metrics_address;  // host:port of this worker's /metrics
};

struct WorkerAgentOptions {
  WorkerIdentity identity;
  Incarnation incarnation;  // non-zero; common/process_info.h NewIncarnation()
  BackoffOptions backoff;
  // A stream that brings no Welcome within this time is abandoned and retried.
  absl::Duration welcome_timeout = absl::Seconds(5);
  // Used when a Welcome carries no heartbeat interval.
  absl::Duration default_heartbeat_interval = absl::Seconds(1);
  // After half-closing (drain, shutdown), how long to wait for the
  // coordinator to end the stream before cancelling it.
  absl::Duration close_timeout = absl::Seconds(2);
  // Reconnect attempts are logged at most once per this interval.
  absl::Duration reconnect_log_interval = absl::Seconds(5);
  // Waits until the coordinator's channel is connected or `deadline`
  // passes; true when connected. When the channel was not connected, the
  // wait before a retry ends as soon as it is, instead of sleeping out the
  // backoff delay: a worker started with (or just before) its coordinator
  // attaches the moment the coordinator listens. A channel connected already
  // means the coordinator refused: the delay is waited out. Called in slices
  // of at most 100 ms so a shutdown is not held up. Null: retries wait their
  // whole delay.
  std::function<bool(absl::Time deadline)> wait_for_coordinator;
};

// Thread-safe: Run() once from one thread; Shutdown() and the accessors from
// any thread.
class WorkerAgent {
 public:
  // `trainer` and `clock` must outlive the agent. `clock` times heartbeat
  // round trips, the ack timeout and log rate limits; waits between
  // heartbeats and reconnects are in real time. Metrics are registered in
  // `registry` (one agent per registry).
  WorkerAgent(std::unique_ptr<v1::Workers::StubInterface> stub, Trainer* trainer,
              const Clock* clock, std::shared_ptr<prometheus::Registry> registry,
              WorkerAgentOptions options);
  ~WorkerAgent();
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

  // Attaches and serves coordinator commands until Drain or Shutdown, then
  // closes the stream cleanly and stops the trainer. Returns OK in both
  // cases; FailedPrecondition if called twice. Never returns because the
  // coordinator is unreachable.
  absl::Status Run();

  // Asks Run() to close the stream and return. Safe from any thread, any
  // number of times, before or during Run (not from a signal handler).
  void Shutdown();

  // Called by the trainer (from its own thread) when the held assignment's
  // training ended by itself: OK = all steps done (reported COMPLETED),
  // otherwise FAILED with the status as the message. Ignored when the
  // assignment has since changed. Thread-safe.
  void ReportTrainingFinished(const JobId& job, Generation generation, const absl::Status& status);
  // Sends a heartbeat with the trainer's progress now, besides the regular
  // ones (whose cadence stays): the trainer completed a generation's first
  // step, which the coordinator times a recovery by. From any thread.
  void ReportProgressNow();
  // Called by the trainer when training of the held generation stopped
  // because a peer failed (the state is kept): reported SUSPENDED with
  // `held`, so the coordinator can recover even before it notices the loss.
  // `why`: the step's error; the peer it names (comm::FailedPeer) is
  // reported as unreachable.
  void ReportSuspended(const JobId& job, Generation generation,
                       const std::vector<v1::HeldState>& held, const absl::Status& why);

  // The assignment held now, if any.
  std::optional<Assignment> held() const;
  const WorkerMetrics& metrics() const { return metrics_; }
  const WorkerIdentity& identity() const { return options_.identity; }

 private:
  struct SessionResult {
    bool welcomed = false;
    absl::Status status;  // how the stream ended
  };
  // Undelivered statuses kept across reconnects; older ones are dropped first.
  static constexpr size_t kMaxPendingStatuses = 16;

  // One Attach stream from Hello to Finish.
  SessionResult RunSession();
  // Waits until `deadline`, a stop, or options_.wait_for_coordinator says
  // the coordinator is reachable, whichever comes first.
  void WaitForCoordinator(absl::Time deadline);
  // Reads CoordinatorMessages until the stream ends.
  void ReadLoop(std::shared_ptr<AttachStream> stream);
  void HandleWelcome(const std::shared_ptr<AttachStream>& stream, const v1::Welcome& welcome);
  void HandleAck(const v1::HeartbeatAck& ack);
  // Heartbeats every interval until the stream ends or the agent stops;
  // cancels the stream when nothing has arrived for longer than `timeout`.
  void HeartbeatLoop(const std::shared_ptr<AttachStream>& stream, absl::Duration interval,
                     absl::Duration timeout);
  void SendHeartbeat(const std::shared_ptr<AttachStream>& stream);
  // Half-closes and waits up to close_timeout for the coordinator to end the stream.
  void CloseStream(const std::shared_ptr<AttachStream>& stream);

  void CommandLoop();
  // Whether `command` names a generation older than one already commanded
  // for its job (then it is skipped); records its generation otherwise.
  bool IsStale(const v1::CoordinatorMessage& command) ABSL_LOCKS_EXCLUDED(mu_);
  void ExecuteAssign(const v1::Assign& assign);
  void ExecuteReconfigure(const v1::Reconfigure& reconfigure);
  void ExecuteStop(const v1::Stop& stop);
  void ExecuteDrain(const v1::Drain& drain);
  void ExecuteSuspend(const v1::Suspend& suspend);
  // Passes a WarmUp to the trainer unless it is older than the last one
  // applied, or names a job while this worker holds an assignment.
  void ExecuteWarmUp(const v1::WarmUp& warm);
  void ExecuteDonate(Assignment assignment);
  // An arriving Suspend or Stop for the held job interrupts a Prepare of it
  // (reader thread).
  void InterruptFor(const std::string& job, uint64_t generation);
  // Prepares `assignment` and reports READY or FAILED.
  void PrepareAndReport(Assignment assignment);
  // Writes the status to the welcomed stream, or keeps it for the next one.
  // `prepare` goes with READY only.
  void SendStatus(const JobId& job, Generation generation, v1::AssignmentState state,
                  const std::string& message, const std::vector<v1::HeldState>& held = {},
                  const v1::PreparePhases& prepare = {},
                  const std::vector<std::string>& unreachable = {});
  // Writes undelivered statuses, oldest first, until one fails.
  void FlushPendingStatuses(const std::shared_ptr<AttachStream>& stream)
      ABSL_LOCKS_EXCLUDED(flush_mu_);

  v1::WorkerMessage NewMessage() const;
  bool StoppingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_requested_ || drain_requested_;
  }
  // Rate-limited by options_.reconnect_log_interval.
  void LogReconnectLocked(absl::Duration delay, int attempt, const absl::Status& last_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<v1::Workers::StubInterface> stub_;
  Trainer* const trainer_;
  const Clock* const clock_;
  WorkerMetrics metrics_;
  const WorkerAgentOptions options_;

  // Order: flush_mu_ before mu_.
  absl::Mutex flush_mu_;
  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool command_thread_exit_ ABSL_GUARDED_BY(mu_) = false;
  // The current stream (at most one at a time; its reader is joined before
  // the next starts).
  bool session_ended_ ABSL_GUARDED_BY(mu_) = false;
  // ReportProgressNow asked for a heartbeat before the next regular one.
  bool progress_due_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::Welcome> session_welcome_ ABSL_GUARDED_BY(mu_);
  absl::Time last_received_ ABSL_GUARDED_BY(mu_);  // by clock_
  // The stream that statuses go to: set once it has been welcomed.
  std::shared_ptr<AttachStream> welcomed_stream_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::CoordinatorMessage> commands_ ABSL_GUARDED_BY(mu_);
  // The newest generation commanded per job, from the current coordinator.
  static constexpr size_t kMaxRememberedJobs = 64;
  absl::flat_hash_map<std::string, uint64_t> newest_generation_ ABSL_GUARDED_BY(mu_);
  // WarmUp.sequence of the last WarmUp applied (0 with a new coordinator).
  uint64_t last_warm_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::string coordinator_id_ ABSL_GUARDED_BY(mu_);
  std::optional<Assignment> held_ ABSL_GUARDED_BY(mu_);
  // The state last reported for held_ (READY once prepared).
  v1::AssignmentState held_state_ ABSL_GUARDED_BY(mu_) = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  // Statuses not yet written to any stream, oldest first.
  std::deque<v1::AssignmentStatus> pending_statuses_ ABSL_GUARDED_BY(mu_);
  uint64_t next_heartbeat_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  // Send times of heartbeats still waiting for their ack.
  absl::flat_hash_map<uint64_t, absl::Time> heartbeat_sent_at_ ABSL_GUARDED_BY(mu_);
  absl::Time last_reconnect_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int suppressed_reconnect_logs_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled on every change the run loop or command thread waits for.
  absl::CondVar cv_;
};

}  // namespace cohort::worker
