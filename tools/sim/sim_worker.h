#pragma once
// SimWorker: one simulated worker daemon, i.e. one Attach stream on gRPC's
// asynchronous API (no thread of its own: a completion queue's thread runs
// Proceed for it). It says Hello, waits for the Welcome, sends heartbeats
// when the scheduler asks and times each one until its HeartbeatAck. It
// accepts every Assign/Reconfigure (status READY) and answers Stop with
// RELEASED, so job planning can run against simulated workers.
//
// Why not the callback API: in Debian's gRPC build every completion queue
// keeps a list of its outstanding operations that each completion searches,
// and all callback calls of a process share one queue; with 10,000 streams
// that search was a third of the simulator's CPU. The simulator spreads its
// workers over several queues.
//
// Lifecycle:  Start --> connecting --Welcome--> attached --Close--> closing
//                 \____________________\______________________\--> done
// (done: the status came and gRPC holds none of the worker's tags).
// Thread-safe: SendHeartbeat, Close and Cancel may be called from any thread.
// At most one write is outstanding; others queue. The object must outlive
// done() or the process.

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

class SimWorker {
 public:
  struct Options {
    std::string worker_id{};
    std::string host{};
    int32_t device_index = 0;
    uint64_t incarnation = 1;  // non-zero
  };

  // `window` and `counters` must outlive this worker.
  SimWorker(Options options, const MeasurementWindow* window, SimCounters* counters);

  // Opens the stream on `stub` with its completions on `queue` (both must
  // outlive the stream) and sends Hello. Call once.
  void Start(v1::Workers::Stub* stub, grpc::CompletionQueue* queue);

  // Runs one completion of some SimWorker's operation: call it with every
  // tag the queues given to Start return.
  static void Proceed(void* tag, bool ok);

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

 private:
  enum class State { kNew, kConnecting, kAttached, kClosing, kDone };
  enum class Op { kStart, kRead, kWrite, kWritesDone, kFinish };
  // The tag of each operation: which worker, which operation.
  struct Event {
    SimWorker* worker;
    Op op;
  };
  using Stream = grpc::ClientAsyncReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>;

  // Completions, on the queue's thread. Each runs under mu_: the
  // asynchronous API never completes an operation inside the call that
  // starts it.
  void OnStarted(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRead(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnWrite(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Done once the status came and no operation is outstanding; after that
  // the object may be freed, so this is the last thing a completion does.
  void MaybeDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Enqueue(v1::WorkerMessage message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next queued write, or WritesDone when closing and drained.
  void NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleAck(uint64_t sequence, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReplyStatus(const std::string& job_id, uint64_t generation, v1::AssignmentState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const MeasurementWindow* const window_;
  SimCounters* const counters_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
  Event start_event_{this, Op::kStart};
  Event read_event_{this, Op::kRead};
  Event write_event_{this, Op::kWrite};
  Event writes_done_event_{this, Op::kWritesDone};
  Event finish_event_{this, Op::kFinish};

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  v1::CoordinatorMessage incoming_ ABSL_GUARDED_BY(mu_);    // the outstanding read's
  v1::WorkerMessage writing_message_ ABSL_GUARDED_BY(mu_);  // the outstanding write's
  grpc::Status status_ ABSL_GUARDED_BY(mu_);                // Finish's
  // Which of the worker's tags gRPC holds.
  bool starting_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // also: Hello waits for the start
  bool writes_done_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_started_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;  // no more writes start
  bool finished_ ABSL_GUARDED_BY(mu_) = false;        // the status came
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
