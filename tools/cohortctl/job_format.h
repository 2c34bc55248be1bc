#pragma once
// Human-readable renderings of jobs and workers for cohortctl's table output.
// Pure functions, thread-safe.

#include <string>

#include "absl/time/time.h"
#include "cohort/v1/job.pb.h"
#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/workers.pb.h"

namespace cohort::cohortctl {

// "RUNNING" for JOB_STATE_RUNNING; "UNKNOWN(n)" for numbers the proto lacks.
std::string JobStateName(v1::JobState state);
// "IDLE" for WORKER_STATE_IDLE, likewise.
std::string WorkerStateName(v1::WorkerState state);
// "PROGRESS" for JOB_EVENT_KIND_PROGRESS, likewise.
std::string JobEventKindName(v1::JobEventKind kind);
// "PEER" for RECOVERY_KIND_PEER, likewise.
std::string RecoveryKindName(v1::RecoveryKind kind);

// True for COMPLETED, FAILED and CANCELLED.
bool IsTerminal(v1::JobState state);

// "2x2x1" (data x tensor x pipeline), "-" while the job has no mesh.
std::string MeshShape(const v1::Mesh& mesh);

// "cpu:0", "gpu:3"; UNSPECIFIED devices are CPUs (the JobSpec default).
std::string DeviceLabel(v1::DeviceKind kind, int32_t index);

// "120/200".
std::string StepProgress(const v1::Job& job);

// Compact durations: "850ms", "4.2s", "3m07s", "2h05m".
std::string FormatAge(absl::Duration age);

// Table of jobs: JOB, NAME, STATE, GEN, WORKERS, MESH, STEP/STEPS, MESSAGE.
std::string FormatJobTable(const v1::ListJobsResponse& response);

// A job's details: identity, state, progress, checkpoints, spec, then the
// mesh table (RANK, WORKER, HOST, DEVICE, DATA, TENSOR, PIPELINE). Times
// print in UTC; ages are taken at `now`.
std::string FormatJobDetails(const v1::Job& job, absl::Time now);

// The job's checkpoints as of `now`, for `get` and `watch`:
//   step 1200 committed 3m07s ago
//   step 1500 committed 12.0s ago; last failure step 1400 3m07s ago
//     (storage: <reason>), 7 attempts failed
//   step 1200 committed 3m07s ago; FAILING: step 1400 failed 4.0s ago
//     (storage: <reason>), 7 attempts failed
//   none committed; FAILING: step 1400 failed 4.0s ago (incomplete:
//     <reason>), 1 attempt failed
// (one line; FAILING when the last failure is newer than the last commit,
// so checkpoints are failing now). The reason is cut in the middle to
// kCheckpointReasonShown characters, keeping its start and its end (where
// a store's message says why). Empty when the job has neither.
inline constexpr size_t kCheckpointReasonShown = 120;
std::string FormatCheckpointStatus(const v1::CheckpointStatus& status, absl::Time now);
// Whether the last failure is newer than the last commit (or there is no
// commit): checkpoints of the job are failing now.
bool CheckpointsFailing(const v1::CheckpointStatus& status);

// How the job's current generation got its training state, for `get`:
//   PEER at step 120 (generation 3 from generation 2's memory, 1 donor,
//     0 steps lost): <reason>
//   CHECKPOINT step 100, 20 steps lost: <reason>
//   NONE, fresh start at step 0, 120 steps lost: <reason>
// (one line each; the donor count only when there are donors, ": <reason>"
// only when the plan has one). Empty when the generation has no recovery
// plan (kind UNSPECIFIED).
std::string FormatRecoveryPlan(const v1::Job& job);

// The job's recovery totals, for `get`:
//   2 peer (1 with a spare), 1 from checkpoint, 20 steps lost; last took
//     0.184 s from detection to running
// (one line; the spare count only when nonzero). Empty when the job has
// never recovered.
std::string FormatRecoveryStats(const v1::RecoveryStats& stats);

// What a RECOVERED event reports about `job`, for `watch`:
//   generation 3: PEER at step 120, 0 steps lost, 0.184 s from detection to
//     running
// (one line; "CHECKPOINT step 100" or "NONE, fresh start at step 0" for
// the other kinds; the time only when the coordinator measured one).
std::string FormatRecovered(const v1::Job& job);

// Table of workers: WORKER, HOST, DEVICE, STATE, JOB, RANK, HEARTBEAT AGE,
// METRICS.
std::string FormatWorkerTable(const v1::ListWorkersResponse& response);

// The line drain prints: "worker w3: DRAINING (its job j-1 is re-planned
// without it; it exits once its state is handed over)", or "worker w3:
// DRAINING (in no job; it exits now)", or "worker w3: <STATE>" in any other
// state.
std::string FormatDrainedWorker(const v1::WorkerInfo& worker);

// One line after submit, cancel or scale: "<job id> <STATE>" and, when the
// coordinator gave one, " (<message>)".
std::string FormatJobSummary(const v1::Job& job);

}  // namespace cohort::cohortctl
