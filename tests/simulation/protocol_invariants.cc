// The invariants the simulator checks (docs/architecture.md, "Protocol
// simulation"), and the ground truth they are checked against.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tests/simulation/sim_worker.h"
#include "tests/simulation/sim_world.h"

namespace cohort::simulation {

void World::StepReduced(const std::string& job, uint64_t generation, int64_t step,
                        const std::vector<std::pair<int, uint64_t>>& members) {
  // At most one generation of a job trains at a time: once a generation's
  // ranks have reduced a step together, an older generation's may only if
  // the coordinator has given up every one of its members (a fenced zombie:
  // processes frozen or cut off while the job moved on, whose uploads, KV
  // writes and statuses name a stale generation and are refused). A rank
  // frozen inside its own end phase finishing a step alone is not training.
  uint64_t& newest = newest_trained_generation_[job];
  if (generation < newest && coordinator_up_) {
    std::map<std::string, v1::WorkerInfo> known;
    for (v1::WorkerInfo& info : coordinator_->ListWorkers()) known[info.worker_id()] = info;
    for (const auto& [index, incarnation] : members) {
      auto it = known.find(absl::StrCat("w", index));
      if (it != known.end() && it->second.incarnation() == incarnation &&
          it->second.state() != v1::WORKER_STATE_LOST && it->second.job_id() == job) {
        Violation(absl::StrCat("generation ", generation, " of ", job, " reduced step ", step,
                               " after generation ", newest, " had trained, and the coordinator ",
                               "still counts its member w", index, " as ",
                               v1::WorkerState_Name(it->second.state())));
        break;
      }
    }
  }
  newest = std::max(newest, generation);
}

void World::StepCompleted(const std::string& job, uint64_t generation, int index, int64_t step) {
  max_completed_[job] = std::max(max_completed_[job], step);
  if (step % 25 == 0) Trace(absl::StrCat("w", index, " completed step ", step, " (g", generation, ")"));
}

void World::CheckpointTaken(const std::string& job, uint64_t generation, int64_t step) {
  const uint64_t epoch = coordinator_epoch_;
  // Uploads of a generation that is no longer current are refused (fencing).
  AtCoordinator(epoch, timing_.checkpoint_upload, [this, job, generation, step] {
    absl::StatusOr<v1::Job> current = coordinator_->GetJob(JobId(job));
    if (!current.ok() || current->generation() != generation) return;
    int64_t& committed = committed_checkpoint_[job];
    committed = std::max(committed, step);
  });
}

std::optional<int64_t> World::CommittedCheckpoint(const std::string& job) const {
  auto it = committed_checkpoint_.find(job);
  if (it == committed_checkpoint_.end()) return std::nullopt;
  return it->second;
}

void World::NoteReportedStep(const std::string& job, int64_t step) {
  int64_t& reported = max_reported_[job];
  reported = std::max(reported, step);
}

void World::OnPlanIssued(const std::string& job, uint64_t generation, const v1::Mesh& mesh,
                         const v1::RecoveryPlan& plan) {
  uint64_t& planned = planned_generation_[job];
  if (generation <= planned) return;  // this generation's plan was checked
  planned = generation;
  absl::StatusOr<v1::Job> current = coordinator_->GetJob(JobId(job));
  const uint64_t live = current.ok() ? current->live_state().generation() : 0;
  Trace(absl::StrCat("plan ", job, " g", generation, " (dp ", mesh.data_parallel(), " tp ",
                     mesh.tensor_parallel(), " pp ", mesh.pipeline_parallel(), "): ",
                     v1::RecoveryKind_Name(plan.kind()),
                     " at step ", plan.step(), ", ", plan.lost_steps(), " lost (", plan.reason(),
                     ")"));
  if (generation > 1) {
    // State that every member of the live generation still holds (none of
    // them crashed, each came back within the re-adoption grace) must not be
    // given up for an older checkpoint or a fresh start. Exempt: a member
    // whose stream broke while it was frozen or cut off, which the
    // coordinator cannot tell from a killed one and awaits only briefly, and
    // one that overlapping faults kept away longer than the grace.
    bool exempt = false;
    if (current.ok()) {
      for (const v1::MeshMember& member : current->live_state().mesh().members()) {
        const int index = IndexOf(member.worker_id());
        auto it = broken_while_unreachable_.find(index);
        exempt |= it != broken_while_unreachable_.end() && Now() - it->second < absl::Minutes(1);
        exempt |= OutlastedGrace(index);
      }
    }
    if (plan.kind() != v1::RECOVERY_KIND_PEER && live != 0 && current.ok() && !exempt) {
      bool all_held = current->live_state().mesh().members_size() > 0;
      std::string holders;
      for (const v1::MeshMember& member : current->live_state().mesh().members()) {
        const int index = IndexOf(member.worker_id());
        const SimWorker* w = index >= 0 && index < static_cast<int>(workers_.size())
                                 ? workers_[static_cast<size_t>(index)].get()
                                 : nullptr;
        bool holds = false;
        if (w != nullptr && w->alive() && w->incarnation() == member.incarnation()) {
          for (const v1::HeldState& held : w->HeldStates(job)) {
            if (held.generation() == live && held.step() > plan.step()) {
              holds = true;
              absl::StrAppend(&holders, holders.empty() ? "" : ", ", member.worker_id(), "@",
                              held.step());
            }
          }
        }
        all_held &= holds;
      }
      if (all_held) {
        Violation(absl::StrCat("generation ", generation, " of ", job, " starts over (",
                               v1::RecoveryKind_Name(plan.kind()), " at step ", plan.step(),
                               ") although every member of the live generation ", live,
                               " is alive and holds its state (", holders, ")"));
      }
    }
    // Lost steps: at least what the coordinator was told was done, at most
    // what was really done.
    const int64_t known = std::max<int64_t>(0, max_reported_[job] - plan.step());
    const int64_t done = std::max<int64_t>(0, max_completed_[job] - plan.step());
    if (plan.lost_steps() < known) {
      Violation(absl::StrCat("generation ", generation, " of ", job, " reports ",
                             plan.lost_steps(), " lost steps resuming at step ", plan.step(),
                             ", but the coordinator had been told of step ", max_reported_[job]));
    }
    if (plan.lost_steps() > done) {
      Violation(absl::StrCat("generation ", generation, " of ", job, " reports ",
                             plan.lost_steps(), " lost steps resuming at step ", plan.step(),
                             ", but only step ", max_completed_[job], " was ever completed"));
    }
  }
}

void World::OnJobEvent(const v1::Job& job) {
  // A recovery took effect once its generation runs (every member READY):
  // later plans count lost steps from its step.
  uint64_t& effective = effective_generation_[job.job_id()];
  if (job.state() != v1::JOB_STATE_RUNNING || job.generation() <= effective) return;
  effective = job.generation();
  max_reported_[job.job_id()] = job.recovery().step();
  max_completed_[job.job_id()] = job.recovery().step();
}

void World::CheckMembership() {
  if (!coordinator_up_) return;
  std::map<std::string, v1::WorkerInfo> workers;
  for (v1::WorkerInfo& info : coordinator_->ListWorkers()) workers[info.worker_id()] = info;
  for (const v1::Job& job : coordinator_->ListJobs(/*include_finished=*/false)) {
    for (const v1::MeshMember& member : job.mesh().members()) {
      auto it = workers.find(member.worker_id());
      if (it == workers.end()) continue;  // awaited after a restart
      const v1::WorkerInfo& info = it->second;
      if (info.state() == v1::WORKER_STATE_IDLE ||
          (info.state() == v1::WORKER_STATE_ASSIGNED && info.job_id() != job.job_id())) {
        Violation(absl::StrCat(member.worker_id(), " is ", v1::WorkerState_Name(info.state()),
                               info.job_id().empty() ? "" : " in " + info.job_id(),
                               " but a member of ", job.job_id(), " generation ",
                               job.generation()));
      }
    }
  }
}

void World::CheckLiveness(bool final) {
  if (job_id_.empty() || !coordinator_up_) return;
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(JobId(job_id_));
  if (!job.ok()) return;
  const v1::JobState state = job->state();
  if (state == v1::JOB_STATE_COMPLETED) {
    job_done_ = true;
    stop_ = true;
    return;
  }
  if (state == v1::JOB_STATE_FAILED || state == v1::JOB_STATE_CANCELLED) {
    Violation(absl::StrCat(job_id_, " ", v1::JobState_Name(state), ": ", job->message()));
    return;
  }
  if (state == v1::JOB_STATE_RUNNING) {
    unhealthy_since_.reset();
  } else if (!unhealthy_since_.has_value()) {
    unhealthy_since_ = Now();
  }
  // Every state moves on: once the faults are over (and every worker is
  // back), a job is RUNNING again within the bound.
  if (unhealthy_since_.has_value()) {
    const absl::Time from = std::max(*unhealthy_since_, last_fault_end_);
    if (Now() - from > options_.recovery_bound) {
      Violation(absl::StrCat(job_id_, " has been ", v1::JobState_Name(state), " for ",
                             absl::FormatDuration(Now() - from), " after the last fault ended (",
                             job->message(), ")"));
      return;
    }
  }
  if (final) {
    Violation(absl::StrCat(job_id_, " did not complete within ",
                           absl::FormatDuration(options_.max_run), ": ", v1::JobState_Name(state),
                           " at step ", job->progress().step(), " (", job->message(), ")"));
  }
}

}  // namespace cohort::simulation
