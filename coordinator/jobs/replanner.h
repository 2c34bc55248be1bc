#pragma once
// Replanner: the decisions of a job's re-plan (job_manager.h, "Re-planning";
// docs/architecture.md, "Elasticity"): when to suspend the members, when the
// suspension is complete, the next mesh (MeshPlanner) and where its state
// comes from (PlanRecovery), whether to wait for lost members that may come
// back with the state, and the installation of the next generation
// (ApplyMesh, also the first mesh of a job the Scheduler starts).
//
// Contract: every call works on an entry of the JobTable it was given and
// reports what workers must be told in Effects. It assigns and releases
// workers in the membership table as meshes change, never marks one lost
// (JobManager fences and reports losses) and never finishes a job. After a
// mesh is installed it refreshes the warm spares. Pure logic: time comes in
// as `now`; no I/O besides the table's JobStore, no threads. Not
// thread-safe (the Coordinator serialises calls).

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"
#include "coordinator/jobs/effects.h"
#include "coordinator/jobs/job_entry.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/jobs/mesh_planner.h"
#include "coordinator/jobs/warm_spares.h"
#include "coordinator/membership/membership_table.h"

namespace cohort::coordinator {

class Replanner {
 public:
  // The meanings are JobManager::Options's fields of the same names.
  struct Options {
    absl::Duration readopt_grace = absl::Seconds(10);
    absl::Duration suspend_timeout = absl::Seconds(10);
    absl::Duration stream_rejoin_grace = absl::Seconds(3);
    absl::Duration prepare_timeout = absl::Minutes(10);
    std::function<std::optional<Step>(const JobId&)> latest_checkpoint;
  };
  // The pointees must outlive this.
  Replanner(Options options, JobTable* table, MembershipTable* membership, WarmSpares* warm)
      : options_(std::move(options)), table_(table), membership_(membership), warm_(warm) {}

  // Re-plans an active job over its remaining members plus idle workers:
  // starts (or joins) a suspension when members remain, else plans at once.
  // `only_if_larger` restricts it to growth.
  void Replan(JobEntry& entry, const std::string& reason, bool only_if_larger, absl::Time now,
              Effects* effects);
  // Phase 1: asks every remaining member to suspend, except `answered` (a
  // member whose unasked SUSPENDED starts the phase: a second Suspend could
  // reach it after the next generation's command and interrupt it).
  void BeginSuspension(JobEntry& entry, const std::string& reason, bool growth, absl::Time now,
                       Effects* effects, const std::string& answered = "");
  // Phase 2, once every member answered: plans and applies the next mesh,
  // or waits for workers (or for lost members that may come back).
  void CompleteSuspension(JobEntry& entry, absl::Time now, Effects* effects);
  // Records a SUSPENDED answer (an unasked one starts the suspension).
  void OnSuspended(JobEntry& entry, const WorkerId& worker, const v1::AssignmentStatus& status,
                   absl::Time now, Effects* effects);
  // Installs `mesh` as the next generation and tells every worker involved.
  void ApplyMesh(JobEntry& entry, v1::Mesh mesh, const std::string& reason,
                 const v1::RecoveryPlan& plan, absl::Time now, Effects* effects);
  // Adds a member back during a suspension: it is awaited (due by
  // suspend_timeout from now at the latest) and sent Suspend.
  void AskToSuspend(JobEntry& entry, const WorkerId& worker, Incarnation incarnation,
                    absl::Time now, Effects* effects);
  // A lost member of the live generation whose process may be alive is
  // remembered (JobEntry::returning) for the rejoin grace.
  void RememberReturning(JobEntry& entry, const LostWorker& lost, absl::Time now);
  // When the last member of a job running its live generation was lost and
  // every member may still be alive (a stall of the whole job), puts the
  // mesh back and awaits every member for the grace instead of re-planning;
  // true if it did.
  bool AwaitEveryMember(JobEntry& entry, const std::string& reason, absl::Time now,
                        Effects* effects);
  // A worker attached: takes it back into the suspension of a job it left
  // with that job's state (true), or forgets it where it came back as a new
  // process (its state is gone).
  bool Rejoin(const v1::Hello& hello, absl::Time now, Effects* effects);
  // How long lost holders are awaited before state is given up.
  absl::Duration RejoinGrace(const JobEntry& entry) const;
  // Options::latest_checkpoint's answer, when it is set.
  std::optional<int64_t> LatestCheckpoint(const JobId& id) const;

 private:
  // Turns the suspension's unreachable reports whose two workers are both
  // alive into cuts, then drops from `request` the candidates a cut-free
  // plan leaves out (preferring `holders`); returns them.
  std::vector<std::string> KeepReachable(JobEntry& entry, PlanRequest* request,
                                         const std::map<std::string, int64_t>& holders,
                                         absl::Time now);

  Options options_;
  JobTable* table_;
  MembershipTable* membership_;
  WarmSpares* warm_;
};

}  // namespace cohort::coordinator
