#include "coordinator/jobs/scheduler.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job_workers.h"
#include "coordinator/jobs/mesh_planner.h"
#include "coordinator/jobs/recovery_planner.h"

namespace cohort::coordinator {

void Scheduler::Schedule(absl::Time now, Effects* effects) {
  absl::flat_hash_set<JobId> awaited_jobs;
  for (const auto& [worker, awaited] : table_->awaiting()) awaited_jobs.insert(awaited.job);
  for (const JobId& id : table_->ActiveJobs()) {
    JobEntry& entry = table_->At(id);
    const v1::JobState state = entry.job.state();
    if (IsTerminal(state) || awaited_jobs.contains(id)) continue;
    const v1::DeviceKind kind = entry.job.spec().device_kind();
    if (state == v1::JOB_STATE_PENDING) {
      PlanRequest request = MakePlanRequest(entry.job.spec());
      AppendIdleCandidates(*membership_, entry.job.spec(), &request);
      absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
      if (!mesh.ok()) {
        table_->SetMessage(entry,
                           absl::StrCat("waiting for workers: ", mesh.status().message(),
                                        NoneAttached(*membership_, entry.job.spec().device_kind())),
                           now);
        continue;
      }
      RecoveryInput input;  // no live state: a checkpoint if there is one
      input.next_mesh = *mesh;
      input.checkpoint_step = replanner_->LatestCheckpoint(id);
      v1::RecoveryPlan plan = PlanRecovery(input);
      plan.set_lost_steps(0);
      replanner_->ApplyMesh(entry, *std::move(mesh), "job started", plan, now, effects);
      continue;
    }
    if (!membership_->HasIdle(kind)) continue;
    if (entry.suspension.has_value()) {
      // Waiting for workers after a loss: try again with the new ones.
      if (entry.suspension->awaiting.empty()) replanner_->CompleteSuspension(entry, now, effects);
      continue;
    }
    // A generation still restoring its state is left alone.
    if (entry.job.state() == v1::JOB_STATE_RECONFIGURING && !MeshIncomplete(entry.job.mesh())) {
      continue;
    }
    const bool incomplete = MeshIncomplete(entry.job.mesh());
    if (!incomplete &&
        entry.job.mesh().members_size() >= entry.job.spec().elastic().max_workers()) {
      continue;
    }
    replanner_->Replan(entry, incomplete ? "workers available" : "growing toward max_workers",
                       /*only_if_larger=*/!incomplete, now, effects);
  }
  warm_->Update(effects);
}

}  // namespace cohort::coordinator
