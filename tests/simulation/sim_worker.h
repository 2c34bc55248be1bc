#pragma once
// SimWorker: one simulated cohort-worker process on the simulator's clock.
// Its agent half runs the worker's own protocol core, worker::WorkerProtocol
// (worker/agent/worker_protocol.h: which commands are stale, what each asks
// of the trainer, what each status says, the held assignment, the statuses
// kept across reconnects), driven as WorkerAgent drives it: attach,
// heartbeats, one command at a time. So the simulation tests the protocol
// the worker runs, not a copy. What stays here is the transport (streams,
// Welcome and heartbeat timeouts, backoff) and the trainer half, a model of
// worker/engine/engine_trainer.cc (Prepare: KV bootstrap, peer transfer or
// checkpoint load; the step loop over collectives; the two state versions a
// rank keeps; Suspend, Donate, Stop, Interrupt), which the simulation models
// rather than runs.
//
// Each process has an incarnation; every timer and callback carries it, so
// nothing of a crashed process runs after the crash (World::AtWorker).

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cohort/v1/workers.pb.h"
#include "worker/agent/worker_protocol.h"

namespace cohort::simulation {

class World;

class SimWorker {
 public:
  SimWorker(World* world, int index);

  int index() const { return index_; }
  const std::string& id() const { return id_; }
  uint64_t incarnation() const { return incarnation_; }
  bool alive() const { return alive_; }
  absl::Time frozen_until() const { return frozen_until_; }
  void FreezeUntil(absl::Time until);

  // Process lifecycle.
  void Start();  // a new process (new incarnation) attaches
  void Crash();  // kill -9: gone without a word

  // From the network.
  void OnMessage(uint64_t stream, const v1::CoordinatorMessage& message);
  void OnStreamEnded(uint64_t stream);

  // What this process holds in memory of `job` (for the invariants): the
  // trainer's held states, newest first.
  std::vector<v1::HeldState> HeldStates(const std::string& job) const;
  // The Attach stream in use (0: none).
  uint64_t stream() const { return stream_; }

 private:
  struct Assignment {
    std::string job;
    uint64_t generation = 0;
    v1::JobSpec spec;
    v1::Mesh mesh;
    v1::MeshCoordinates coordinates;
    v1::RecoveryPlan recovery;
    bool donor = false;
    int participant = 0;
  };
  // A generation's training state as the trainer holds it.
  struct Run {
    std::string job;
    uint64_t generation = 0;
    // (worker index, incarnation) of each rank, in rank order.
    std::vector<std::pair<int, uint64_t>> members;
    int rank = 0;
    int64_t newest = 0;        // newest consistent step
    bool has_previous = false;  // also holds newest - 1
    bool trained = false;       // completed a step in this generation
    int64_t steps = 0;
    int64_t checkpoint_interval = 0;
  };
  enum class Phase { kIdle, kCompute, kCollective, kEndPhase };

  // --- agent: drives protocol_ as WorkerAgent does ---
  void Connect();
  void Reconnect();
  void OnWelcome(uint64_t stream, const v1::Welcome& welcome);
  void HeartbeatTick(uint64_t stream);
  void AbandonStream(const std::string& why);
  // The command "thread": takes the next command when not busy.
  void RunNextCommand();
  void CommandDone();
  // Does what protocol_ decided for `command`; CommandDone when finished.
  void Execute(const v1::CoordinatorMessage& command);
  // A trace line for a command about to act (an Assign, a Reconfigure).
  void TraceCommand(const v1::CoordinatorMessage& command,
                    const std::optional<worker::Assignment>& before,
                    const worker::CommandDecision& decision);
  void PrepareAndReport(const worker::Assignment& assignment);
  void DonateAndReport(const worker::Assignment& assignment, const absl::Status& refused);
  void ReportSuspended(const std::string& job, uint64_t generation, const absl::Status& why);
  void ReportTrainingFinished(const std::string& job, uint64_t generation);
  // Adds the progress, traces, keeps the status in protocol_ and flushes.
  void SendStatus(v1::AssignmentStatus status);
  void FlushStatuses();
  v1::Progress CurrentProgress() const;
  static Assignment TrainerAssignment(const worker::Assignment& assignment);
  // A command of `generation` about to act: one older than a command this
  // process already executed for the same job is a protocol violation.
  void ActingOn(const std::string& job, uint64_t generation, const char* what);

  // --- trainer ---
  using Done = std::function<void(absl::Status)>;
  void TrainerPrepare(const Assignment& assignment, Done done);
  void TrainerDonate(const Assignment& assignment, Done done);
  std::vector<v1::HeldState> TrainerSuspend();
  void TrainerStop();
  // As EngineTrainer::Interrupt, InterruptGate::Begin.
  void TrainerInterrupt(const std::string& job, uint64_t generation);
  void BeginInterruptible(const Assignment& assignment);
  // Fails the Prepare or Donate in flight (if any) as Cancelled.
  void CancelOp();
  void SuspendTraining();
  // Build (KV bootstrap among the participants), then `next`.
  void Bootstrap(const Assignment& assignment, uint64_t op, std::function<void()> next);
  void WaitForPeer(const Assignment& assignment, uint64_t op, int peer, int participants,
                   absl::Time deadline, std::function<void()> next);
  // Restores the state the plan names, then `done` with the step it is at.
  void Restore(const Assignment& assignment, uint64_t op, std::function<void(int64_t)> done);
  void FinishPrepare(const Assignment& assignment, uint64_t op, int64_t start);
  void StopAll();
  // Fails the operation in flight (if it is `op`) with `status`.
  void FailOp(uint64_t op, absl::Status status);
  Run* HeldRun(const std::string& job, uint64_t generation);
  bool Serves(const Assignment& assignment) const;
  void StartTraining();
  void ComputeStep(uint64_t epoch);
  void StepReduced(uint64_t epoch, absl::Status status);
  void StepDone(uint64_t epoch);

  World* world_;
  const int index_;
  const std::string id_;
  uint64_t incarnation_ = 0;
  bool alive_ = false;
  absl::Time frozen_until_ = absl::InfinitePast();

  // Agent.
  uint64_t stream_ = 0;
  bool welcomed_ = false;
  absl::Time last_received_;
  absl::Duration heartbeat_interval_;
  absl::Duration heartbeat_timeout_;
  uint64_t heartbeat_sequence_ = 1;
  absl::Duration backoff_;
  bool busy_ = false;  // the command thread is executing one
  // The worker's protocol state; a new one per process (Start).
  std::optional<worker::WorkerProtocol> protocol_;
  std::map<std::string, uint64_t> newest_command_generation_;  // for the invariant

  // Trainer.
  std::optional<Run> run_;
  std::optional<Run> previous_;
  Phase phase_ = Phase::kIdle;
  uint64_t train_epoch_ = 0;  // bumped whenever the step loop stops
  uint64_t op_ = 0;           // the Prepare/Donate in flight (0: none)
  uint64_t next_op_ = 1;
  Done op_done_;
  bool cancelled_ = false;
  std::optional<std::pair<std::string, uint64_t>> interruptible_;
  std::map<std::string, uint64_t> interrupted_;  // job -> newest interrupted generation
};

}  // namespace cohort::simulation
