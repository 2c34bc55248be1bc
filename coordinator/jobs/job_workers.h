#pragma once
// What the job classes (Scheduler, Replanner, JobManager) read off the
// membership table to plan a job, and the one command they send by looking a
// worker up there (Stop). Pure functions over a MembershipTable the caller
// holds; as thread-safe as the table (the Coordinator serialises calls).

#include <string>

#include "cohort/v1/jobs.pb.h"
#include "common/ids.h"
#include "coordinator/jobs/effects.h"
#include "coordinator/jobs/mesh_planner.h"
#include "coordinator/membership/membership_table.h"

namespace cohort::coordinator {

// The planner's view of a worker.
PlannerWorker ToPlannerWorker(const WorkerRecord& record);
// A plan request of `spec`'s shape and bounds, without candidates.
PlanRequest MakePlanRequest(const v1::JobSpec& spec);
// Adds idle workers of the spec's device kind to request->candidates, whole
// hosts at a time, as many as the job could use.
void AppendIdleCandidates(const MembershipTable& membership, const v1::JobSpec& spec,
                          PlanRequest* request);
// " (no GPU worker is attached)" when no worker of `kind` is attached (a
// waiting job's message says so); empty otherwise.
std::string NoneAttached(const MembershipTable& membership, v1::DeviceKind kind);
// Stop(job, generation) to `worker`'s current incarnation; nothing when it is
// unknown or lost.
void SendStop(const MembershipTable& membership, const WorkerId& worker, const JobId& job,
              Generation generation, const std::string& reason, Effects* effects);

}  // namespace cohort::coordinator
