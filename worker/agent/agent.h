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
// What each command means (stale commands, repeats, a Stop or Reconfigure of
// a job not held, the statuses kept across reconnects) is decided by
// WorkerProtocol (worker_protocol.h), which the protocol simulation runs too;
// this class runs it over the gRPC stream with threads and the Trainer.
//
// Threads: Run() owns the attach loop and sends heartbeats; per stream one
// reader thread; one command thread executes Assign/Reconfigure/Suspend/Stop/
// Drain in arrival order (so a slow Prepare never delays heartbeats). A Suspend
// or Stop also interrupts, from the reader thread, the Prepare or Donate it
// is meant for (Trainer::Interrupt), even one still queued. Writes to a stream
// are serialised by the stream's mutex.

#include <cstdint>
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
#include "worker/agent/worker_protocol.h"

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
  // `trainer` and `clock` must outlive the agent. Every time the agent reads
  // (heartbeat cadence and round trips, the ack and Welcome timeouts,
  // backoff delays, log rate limits) comes from `clock`; waits sleep in real
  // time for what is left by it, re-reading it every kClockSlice. Metrics are registered in
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
  // Each wait re-reads clock_ at least this often, so that a deadline on a
  // test's FakeClock ends the wait once the clock passes it.
  static constexpr absl::Duration kClockSlice = absl::Milliseconds(100);

  // One Attach stream from Hello to Finish.
  SessionResult RunSession();
  // Waits until `deadline`, a stop, or options_.wait_for_coordinator says
  // the coordinator is reachable, whichever comes first.
  void WaitForCoordinator(absl::Time deadline);
  // Waits on cv_ for at most the time left until `deadline` (by clock_), in
  // slices of kClockSlice. False once the deadline has passed: callers loop
  // `while (!condition && WaitSliceLocked(deadline)) {}`.
  bool WaitSliceLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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

  // Executes the protocol's commands in arrival order until a Drain or exit.
  void CommandLoop();
  // Does what protocol_ decided for `command`; false after a Drain.
  bool Execute(const v1::CoordinatorMessage& command);
  // Hold, Trainer::Prepare and the status its outcome calls for.
  void PrepareAndReport(const Assignment& assignment);
  // Hold, Trainer::Donate (unless refused) and DONATED.
  void DonateAndReport(const Assignment& assignment, const absl::Status& refused);
  // Adds the trainer's progress, keeps the status in protocol_ and writes
  // what is pending to the welcomed stream, if any.
  void SendStatus(v1::AssignmentStatus status);
  // Writes undelivered statuses, oldest first, until one fails.
  void FlushPendingStatuses(const std::shared_ptr<AttachStream>& stream)
      ABSL_LOCKS_EXCLUDED(flush_mu_);

  v1::WorkerMessage NewMessage() const;
  static v1::Progress ProgressProto(const TrainingProgress& progress);
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
  // The protocol's state: held assignment, command queue, pending statuses.
  WorkerProtocol protocol_ ABSL_GUARDED_BY(mu_);
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
  uint64_t next_heartbeat_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  // Send times of heartbeats still waiting for their ack.
  absl::flat_hash_map<uint64_t, absl::Time> heartbeat_sent_at_ ABSL_GUARDED_BY(mu_);
  absl::Time last_reconnect_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int suppressed_reconnect_logs_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled on every change the run loop or command thread waits for.
  absl::CondVar cv_;
};

}  // namespace cohort::worker
