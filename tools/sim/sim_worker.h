#pragma once
// SimWorker: one simulated worker daemon, i.e. one Attach stream driven by
// the gRPC callback API (no thread of its own). It says Hello, waits for the
// Welcome, sends heartbeats when the scheduler asks and times each one until
// its HeartbeatAck. It accepts every Assign/Reconfigure (status READY) and
// answers Stop with RELEASED, so job planning can run against simulated
// workers.
//
// Lifecycle:  Start --> connecting --Welcome--> attached --Close--> closing
//                 \____________________\______________________\--> done (OnDone)
// Thread-safe: SendHeartbeat, Close and Cancel may be called from any thread;
// gRPC runs the reactions. At most one write is outstanding; others queue.
// The object must outlive OnDone (done() true) or the process.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "tools/sim/measurement_window.h"

namespace cohort::sim {

// Counters shared by all workers of a run. Thread-safe (atomics).
struct SimCounters {
  std::atomic<int> attached{0};         // got a Welcome
  std::atomic<int> failed_attach{0};    // ended before a Welcome
  std::atomic<int> done{0};             // OnDone ran
  std::atomic<int> stream_errors{0};    // ended without our Close, or not OK
  std::atomic<int64_t> assignments{0};  // statuses sent for Assign/Reconfigure/Stop
  std::atomic<int64_t> last_welcome_ns{0};
  std::atomic<uint32_t> heartbeat_timeout_ms{0};  // from a Welcome
};

class SimWorker : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  struct Options {
    std::string worker_id{};
    std::string host{};
    int32_t device_index = 0;
    uint64_t incarnation = 1;  // non-zero
  };

  // `window` and `counters` must outlive this worker.
  SimWorker(Options options, const MeasurementWindow* window, SimCounters* counters);

  // Opens the stream on `stub` (which must outlive the stream) and sends Hello.
  // Call once.
  void Start(v1::Workers::Stub* stub);

  // Queues a heartbeat with the next sequence number, stamped now. No-op
  // unless attached.
  void SendHeartbeat();

  // Half-closes the stream (WritesDone) after the write in flight; queued
  // heartbeats are dropped. The coordinator then finishes the call. No-op if
  // never started or already closing.
  void Close();

  // Cancels the call outright (for streams that do not finish after Close).
  void Cancel();

  bool attached() const;
  bool done() const;
  // Why the stream failed (set in OnDone); empty if it did not.
  std::string error() const;
  // Heartbeats sent inside the window whose ack has not come (yet).
  int64_t PendingInWindow() const;

  struct Results {
    std::vector<double> rtt_ms;  // acks of heartbeats sent inside the window
    int64_t unacked = 0;         // heartbeats sent inside the window, never acked
    std::string error;           // why the stream failed; empty if it did not
  };
  // Moves out the results; call after done() (or when the run gave up on it).
  Results TakeResults();

  // Reactions (gRPC threads).
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  enum class State { kNew, kConnecting, kAttached, kClosing, kDone };

  // What to do with the stream once mu_ is released: gRPC may run reactions
  // inline, so Start* calls are never made while holding mu_.
  struct Actions {
    bool write = false;
    bool writes_done = false;
    bool release_hold = false;
  };

  void Enqueue(v1::WorkerMessage message, Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next queued write, or WritesDone when closing and drained.
  void NextWriteLocked(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseHoldLocked(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Act(const Actions& actions);
  void HandleAck(uint64_t sequence, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReplyStatus(const std::string& job_id, uint64_t generation, v1::AssignmentState state,
                   Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const MeasurementWindow* const window_;
  SimCounters* const counters_;
  grpc::ClientContext context_;
  // Owned by the outstanding read: only reactions touch it.
  v1::CoordinatorMessage incoming_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  // The message of the outstanding write. Filled under mu_ while no write is
  // outstanding; gRPC reads it until OnWriteDone, so it is not guarded.
  v1::WorkerMessage writing_message_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_started_ ABSL_GUARDED_BY(mu_) = false;
  // The hold lets threads other than reactions start writes; released once
  // no more writes will start, which lets OnDone come.
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::WorkerMessage> outbox_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  struct SentHeartbeat {
    uint64_t sequence;
    int64_t sent_ns;
  };
  std::deque<SentHeartbeat> awaiting_ack_ ABSL_GUARDED_BY(mu_);
  std::vector<double> rtt_ms_ ABSL_GUARDED_BY(mu_);
  int64_t unacked_ ABSL_GUARDED_BY(mu_) = 0;
  std::string error_ ABSL_GUARDED_BY(mu_);
  // The assignment this worker reported READY for, if any: its heartbeats
  // then carry progress, one step further each time, as a training worker's
  // do (or the coordinator's stall detection fences it after 30 s).
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cohort::sim
