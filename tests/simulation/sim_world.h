#pragma once
// World: the simulated cluster behind RunSimulation (protocol_sim.h). It owns
// the fake clock, the event queue, the coordinator process (the real
// Coordinator facade, restarted from the same in-memory JobStore after a
// crash), the network between it and the workers, the training "fabric"
// (collectives and peer transfers among workers), the ground truth (every
// step any rank completed) and the invariant checks. Single-threaded.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cohort/v1/workers.pb.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/jobs/job_store.h"
#include "tests/simulation/event_queue.h"
#include "tests/simulation/protocol_sim.h"

namespace cohort::simulation {

class SimWorker;

// A rank waiting in a collective or transfer.
struct Waiter {
  int index = 0;
  uint64_t incarnation = 0;
  uint64_t id = 0;
  std::function<void(absl::Status)> done;
};

// Timing of the simulated processes and network.
struct SimTiming {
  absl::Duration link_min = absl::Microseconds(100);
  absl::Duration link_max = absl::Milliseconds(3);
  absl::Duration interleave_max = absl::Milliseconds(30);  // a thread descheduled on a busy host
  absl::Duration step_compute_min = absl::Milliseconds(60);
  absl::Duration step_compute_max = absl::Milliseconds(120);
  absl::Duration end_phase_max = absl::Milliseconds(25);  // AdamW, gathers, mirrors
  absl::Duration peer_failure_detect_max = absl::Milliseconds(30);  // UCX error on a dead peer
  absl::Duration build_max = absl::Milliseconds(40);     // contexts, sessions
  absl::Duration transfer_max = absl::Milliseconds(80);  // peer restore
  absl::Duration checkpoint_load_max = absl::Milliseconds(120);
  absl::Duration checkpoint_upload = absl::Milliseconds(60);
  absl::Duration bootstrap_timeout = absl::Seconds(120);  // EngineTrainerOptions
  absl::Duration collective_timeout = absl::Seconds(60);  // EngineTrainerOptions
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  absl::Duration readopt_grace = absl::Seconds(10);
  absl::Duration stream_rejoin_grace = coordinator::JobManager::Options{}.stream_rejoin_grace;
  absl::Duration suspend_timeout = absl::Seconds(10);
};

class World {
 public:
  World(const SimOptions& options, SimResult* result);
  ~World();

  void Run();

  // --- for SimWorker ---
  absl::Time Now() const { return queue_.Now(); }
  std::mt19937_64& rng() { return rng_; }
  absl::Duration Uniform(absl::Duration lo, absl::Duration hi);
  bool Chance(double p);
  const SimTiming& timing() const { return timing_; }
  void Trace(const std::string& line);
  void Violation(const std::string& what);

  // Runs `fn` in worker `index`'s process `incarnation`: dropped if that
  // process died, deferred while it is frozen.
  void AtWorker(int index, uint64_t incarnation, absl::Duration delay, std::function<void()> fn);

  // Attach streams, worker side. OpenStream sends the Hello.
  uint64_t OpenStream(int index, uint64_t incarnation, const v1::WorkerMessage& hello);
  void SendOnStream(uint64_t stream, const v1::WorkerMessage& message);
  void CancelStream(uint64_t stream);

  // KeyValue calls (unary RPCs); `done` runs in the worker's process.
  void KvSet(int index, uint64_t incarnation, const std::string& job, uint64_t generation,
             const std::string& key, std::function<void(absl::Status)> done);
  void KvWaitFor(int index, uint64_t incarnation, const std::string& job, uint64_t generation,
                 const std::string& key, absl::Duration timeout,
                 std::function<void(absl::Status)> done);
  // One KeyValue RPC: `call` runs in the coordinator process and answers
  // through the callback it is given; `done` sees the answer after a link
  // delay, Unavailable if the coordinator is down or dies first,
  // DeadlineExceeded at the client's `deadline`. Exactly one answer.
  void KvCall(int index, uint64_t incarnation, absl::Duration deadline,
              std::function<void(std::function<void(absl::Status)>)> call,
              std::function<void(absl::Status)> done);

  // The training fabric. A collective of generation `generation` completes
  // when every rank of its mesh has arrived; a crashed member makes it fail
  // (Unavailable) after the detection delay.
  void ArriveAtCollective(const std::string& job, uint64_t generation, int64_t step,
                          const std::vector<std::pair<int, uint64_t>>& members, int index,
                          uint64_t incarnation,
                          std::function<void(absl::Status)> done);
  // A peer transfer among a generation's participants: completes once all
  // have joined, fails when one of them dies first.
  void JoinTransfer(const std::string& job, uint64_t generation,
                    const std::vector<std::pair<int, uint64_t>>& participants, int index, uint64_t incarnation,
                    std::function<void(absl::Status)> done);
  // Leaves every collective and transfer (Suspend, Stop, Interrupt).
  void LeaveFabric(int index, uint64_t incarnation);

  // Ground truth.
  void StepReduced(const std::string& job, uint64_t generation, int64_t step,
                   const std::vector<std::pair<int, uint64_t>>& members);
  void StepCompleted(const std::string& job, uint64_t generation, int index, int64_t step);
  void CheckpointTaken(const std::string& job, uint64_t generation, int64_t step);
  std::optional<int64_t> CommittedCheckpoint(const std::string& job) const;
  // Which worker index runs `worker_id` (ids are "w<index>").
  static int IndexOf(const std::string& worker_id);
  const std::vector<std::unique_ptr<SimWorker>>& workers() const { return workers_; }

 private:
  struct Stream;
  struct Collective {
    std::vector<std::pair<int, uint64_t>> members;
    std::vector<Waiter> waiting;
  };
  struct Transfer {
    std::vector<std::pair<int, uint64_t>> participants;
    std::vector<Waiter> waiting;
  };
  class SimSink;
  class ForwardingJobStore;

  // Coordinator process.
  void StartCoordinator();
  void CrashCoordinator();
  bool CoordinatorFrozen() const { return Now() < coordinator_frozen_until_; }
  // Runs `fn` in the coordinator process (epoch): dropped if it crashed,
  // deferred while frozen.
  void AtCoordinator(uint64_t epoch, absl::Duration delay, std::function<void()> fn);
  void ScheduleTick(uint64_t epoch);
  // Each coordinator call: its deliveries may run late (interleaving).
  void BeginCall();
  void DeliverToCoordinator(uint64_t stream, const v1::WorkerMessage& message);
  void NoteReports(const Stream& stream, const v1::WorkerMessage& message);
  void EndStreamAtCoordinator(uint64_t stream, bool detach);
  void FinishStream(uint64_t stream);  // coordinator side ends it: worker sees the end
  // The coordinator closes a stream a newer one of the same process took
  // over (WorkerSink::Close): as the Attach reactor, right after the call.
  void CloseStream(uint64_t stream);
  void SendToWorker(uint64_t stream, const v1::CoordinatorMessage& message);
  bool Partitioned(int index) const;
  // When a message sent now on a stream of worker `index` arrives; `last`
  // is that direction's previous arrival, updated.
  absl::Time ArrivalTime(int index, absl::Time* last);

  // Faults.
  void ScheduleFaults();
  void Inject(const ScriptedFault& fault);

  // Invariants (protocol_invariants.cc).
  void OnPlanIssued(const std::string& job, uint64_t generation, const v1::Mesh& mesh,
                    const v1::RecoveryPlan& plan);
  void NoteReportedStep(const std::string& job, int64_t step);
  void OnJobEvent(const v1::Job& job);
  void WatchJob();
  void CheckMembership();
  void CheckLiveness(bool final);

  void Submit();
  void FailCollectivesOf(int index);
  void FailWaiters(std::vector<Waiter>* waiting, const absl::Status& status);
  void TimeOut(std::vector<Waiter>* waiting, uint64_t id, const char* what);

  const SimOptions options_;
  SimResult* result_;
  SimTiming timing_;
  std::mt19937_64 rng_;
  FakeClock clock_;
  EventQueue queue_;
  SimJob job_;
  std::vector<ScriptedFault> faults_;

  // Coordinator.
  coordinator::InMemoryJobStore persisted_;
  std::unique_ptr<coordinator::CoordinatorMetrics> metrics_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  uint64_t coordinator_epoch_ = 0;
  bool coordinator_up_ = false;
  absl::Time coordinator_frozen_until_ = absl::InfinitePast();
  absl::Duration call_delay_;  // of the coordinator call in progress

  struct KvWait {
    uint64_t epoch;
    std::shared_ptr<bool> answered;
    std::function<void(absl::Status)> reply;
  };
  std::vector<KvWait> kv_waits_;  // KeyValue.WaitFor calls in flight
  std::map<uint64_t, std::unique_ptr<Stream>> streams_;
  uint64_t next_stream_ = 1;
  std::map<int, absl::Time> partitioned_until_;
  // Workers whose stream the coordinator saw break while they were frozen
  // or cut off, and when.
  std::map<int, absl::Time> broken_while_unreachable_;
  // Each worker's spans of unreachability (frozen or cut off). Faults are
  // each shorter than the re-adoption grace, but faults that overlap on one
  // worker make one longer span, and a worker whose stream broke is awaited
  // only briefly (stream_rejoin_grace): past either, the coordinator may
  // rightly give its state up.
  struct Span {
    absl::Time start;
    absl::Time end;
  };
  std::map<int, std::vector<Span>> unreachable_;
  // Workers whose stream broke at the coordinator, until they attach again.
  std::map<int, absl::Time> broken_at_;
  void NoteUnreachable(int worker, absl::Time until);
  bool UnreachableAt(int worker, absl::Time t) const;
  // A member of the live mesh stayed away past the grace the coordinator
  // gives it (within the last minute).
  bool OutlastedGrace(int worker) const;
  std::vector<std::unique_ptr<SimWorker>> workers_;

  std::map<std::pair<std::string, uint64_t>, std::map<int64_t, Collective>> collectives_;
  std::map<std::pair<std::string, uint64_t>, Transfer> transfers_;
  uint64_t next_waiter_id_ = 1;

  // Ground truth and what the coordinator was told, per job.
  std::string job_id_;
  absl::Time submitted_;
  std::map<std::string, int64_t> max_completed_;      // since the last plan
  std::map<std::string, int64_t> max_reported_;       // since the last plan
  std::map<std::string, uint64_t> newest_trained_generation_;
  std::map<std::string, int64_t> committed_checkpoint_;
  std::map<std::string, uint64_t> planned_generation_;
  std::map<std::string, uint64_t> effective_generation_;
  absl::Time last_fault_end_ = absl::InfinitePast();
  std::optional<absl::Time> unhealthy_since_;  // the job was last seen not RUNNING
  bool job_done_ = false;
  bool stop_ = false;
};

}  // namespace cohort::simulation
