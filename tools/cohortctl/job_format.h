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

// A job's details: identity, state, progress, spec, then the mesh table
// (RANK, WORKER, HOST, DEVICE, DATA, TENSOR, PIPELINE). Times print in UTC.
std::string FormatJobDetails(const v1::Job& job);

// Table of workers: WORKER, HOST, DEVICE, STATE, JOB, RANK, HEARTBEAT AGE,
// METRICS.
std::string FormatWorkerTable(const v1::ListWorkersResponse& response);

// One line after submit, cancel or scale: "<job id> <STATE>" and, when the
// coordinator gave one, " (<message>)".
std::string FormatJobSummary(const v1::Job& job);

}  // namespace cohort::cohortctl
