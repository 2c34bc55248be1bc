#pragma once
// A deterministic simulation of Cohort's membership and recovery protocol.
//
// The real coordinator core (Coordinator facade: MembershipTable,
// JobManager, RecoveryPlanner, KvStore, over an in-memory JobStore that
// survives coordinator restarts) runs on a fake clock against simulated
// workers (sim_worker.h: the worker agent's and trainer's protocol as a state
// machine) over a simulated network: per-stream FIFO links with random
// delays, deliveries of concurrent coordinator calls that interleave (as
// they may after the facade's mutex is released), broken streams, worker
// crashes and restarts (new incarnation), freezes of workers, of the
// coordinator or of everything at once, coordinator crashes and restarts from
// its persisted jobs, and partitions between a worker and the coordinator.
// Everything random comes from one seed: the same seed replays the same run,
// event for event.
//
// After every event the simulator checks the protocol's invariants
// (protocol_invariants.h); a violation ends the run with a readable trace.
//
// Thread-safety: RunSimulation is reentrant (each call owns its world); the
// coordinator's log level is process-wide, so runs quiet it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cohort::simulation {

enum class FaultKind {
  kCrashWorker,        // kill -9; the worker restarts later as a new incarnation
  kFreezeWorker,       // SIGSTOP one worker for a while
  kFreezeWorkers,      // SIGSTOP several workers together
  kFreezeAll,          // the coordinator and every worker stop together (a machine stall)
  kCrashCoordinator,   // kill -9 of the coordinator; restarts from its persisted jobs
  kFreezeCoordinator,  // SIGSTOP of the coordinator
  kPartitionWorker,    // nothing passes between one worker and the coordinator
  kPartitionCoordinator,  // nothing passes between the coordinator and any worker
  kBreakStream,        // one worker's Attach stream breaks (both ends see it)
};
const char* FaultKindName(FaultKind kind);

struct ScriptedFault {
  absl::Duration at;  // after the job is submitted
  FaultKind kind;
  std::vector<int> workers;  // worker indices it hits (where it hits workers)
  absl::Duration length;     // freezes, partitions; restarts come after it
};

// The job the simulation runs.
struct SimJob {
  int tensor = 1;
  int pipeline = 1;
  int min_workers = 1;
  int max_workers = 4;
  bool zero1 = false;
  int64_t steps = 300;
  int64_t checkpoint_interval = 0;  // 0: no checkpoints
};

struct SimOptions {
  uint64_t seed = 1;
  // Workers and job; when `randomize` is set the seed picks them (and the
  // faults) instead.
  bool randomize = true;
  int workers = 4;
  SimJob job;
  std::vector<ScriptedFault> faults;
  // Random faults are drawn inside this window after the job starts.
  absl::Duration fault_window = absl::Seconds(30);
  // Every job must be RUNNING again within this long after the last fault
  // ended (given enough workers), and finished by the end of the run.
  absl::Duration recovery_bound = absl::Seconds(90);
  absl::Duration max_run = absl::Minutes(30);  // simulated time
  // Messages between concurrent coordinator calls may swap (probability).
  double interleave_probability = 0.2;
  bool print_trace = false;  // print each event as it happens
};

struct SimResult {
  uint64_t seed = 0;
  std::vector<std::string> violations;  // empty: every invariant held
  std::vector<std::string> trace;       // the run, one line per notable event
  std::string scenario;                 // workers, job and faults, one line
  std::string outcome;                  // final job state, generations, recoveries
  // The outcome's figures, for totals over many seeds.
  bool completed = false;
  int64_t peer_recoveries = 0;
  int64_t checkpoint_recoveries = 0;
  int64_t lost_steps = 0;
  uint64_t events = 0;
  absl::Duration simulated;
  bool ok() const { return violations.empty(); }
};

SimResult RunSimulation(const SimOptions& options);

// Named scenarios (fixed cluster, job and faults; the seed drives timing and
// interleaving), for regression tests and `cohort-sim-protocol --scenario`:
//   stall  4 workers, dp 4 without checkpoints; the coordinator and every
//          worker freeze for 5 s around step 100 (the machine stall that
//          once threw a whole job away).
//   donor  4 workers, dp 4 with ZeRO-1 and no spare; one is killed, so dp 2
//          continues with a third survivor donating its state.
//   any other name: InvalidArgument.
absl::StatusOr<SimOptions> ScenarioOptions(const std::string& name, uint64_t seed);

// The trace of a failed run, for a person: scenario, violations, then the
// last `max_lines` trace lines.
std::string FormatFailure(const SimResult& result, size_t max_lines = 400);

}  // namespace cohort::simulation
