// JobManager: assignment statuses from workers, one handler per state
// (DONATED, READY, SUSPENDED, COMPLETED, FAILED, RELEASED). A READY that
// completes the mesh makes the generation the job's live state and counts
// the recovery that brought it there.

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_workers.h"
#include "coordinator/jobs/loss_history.h"
#include "coordinator/jobs/worker_commands.h"

namespace cohort::coordinator {

absl::Status JobManager::OnAssignmentStatus(const WorkerId& worker,
                                            const v1::AssignmentStatus& status, absl::Time now,
                                            Effects* effects) {
  JobEntry* entry = table_.Find(JobId(status.job_id()));
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("job ", status.job_id(), " not found"));
  }
  if (status.generation() != entry->job.generation()) {
    return absl::AbortedError(absl::StrCat("status for job ", status.job_id(), " generation ",
                                           status.generation(), " is stale: current generation is ",
                                           entry->job.generation()));
  }
  // A donor is no member of the generation it serves.
  if (status.state() == v1::ASSIGNMENT_STATE_DONATED) {
    return OnDonated(*entry, worker, status, now, effects);
  }
  if (!IsMember(*entry, worker)) {
    return absl::AbortedError(absl::StrCat("worker ", worker.value(), " is not a member of job ",
                                           status.job_id(), " generation ", status.generation()));
  }
  switch (status.state()) {
    case v1::ASSIGNMENT_STATE_READY:
      OnReady(*entry, worker, status, now, effects);
      return absl::OkStatus();
    case v1::ASSIGNMENT_STATE_SUSPENDED:
      replanner_.OnSuspended(*entry, worker, status, now, effects);
      return absl::OkStatus();
    case v1::ASSIGNMENT_STATE_COMPLETED:
      OnCompleted(*entry, worker, status, now, effects);
      return absl::OkStatus();
    case v1::ASSIGNMENT_STATE_FAILED:
      OnFailed(*entry, worker, status, now, effects);
      return absl::OkStatus();
    case v1::ASSIGNMENT_STATE_RELEASED:
      OnReleased(*entry, worker, now, effects);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("assignment status state ", static_cast<int>(status.state()),
                       " is not one of READY, COMPLETED, FAILED, RELEASED, SUSPENDED, DONATED"));
  }
}

absl::Status JobManager::OnDonated(JobEntry& entry, const WorkerId& worker,
                                   const v1::AssignmentStatus& status, absl::Time now,
                                   Effects* effects) {
  const JobId job_id(entry.job.job_id());
  if (!entry.donors.contains(worker)) {
    // Not a donor (any more): a re-plan that began before the donation
    // ended took it into its suspension, which its SUSPENDED answers.
    return absl::AbortedError(absl::StrCat("worker ", worker.value(), " is not a donor of job ",
                                           status.job_id(), " generation ", status.generation()));
  }
  if (!status.message().empty()) {
    LOG(WARNING) << "donor " << worker << " of job " << job_id << ": " << status.message();
  }
  if (!status.message().empty() && entry.job.state() == v1::JOB_STATE_RECONFIGURING) {
    // The donation failed, so the members waiting for its pieces would wait
    // out their own deadlines: re-plan now. The donor kept its state
    // (EngineTrainer::Donate), so it stays a donor and is asked to suspend
    // with the members (Replanner::BeginSuspension).
    replanner_.Replan(
        entry,
        absl::StrCat("donor ", worker.value(), " could not serve its state: ", status.message()),
        /*only_if_larger=*/false, now, effects);
    scheduler_.Schedule(now, effects);
    return absl::OkStatus();
  }
  entry.donors.erase(worker);
  const WorkerRecord* record = membership_->Find(worker);
  const bool draining = record != nullptr && record->state == WorkerState::kDraining;
  if (!status.message().empty()) {
    // The generation runs without its pieces: what it kept is obsolete.
    SendStop(*membership_, worker, job_id, Generation(status.generation()), "no longer a donor",
             effects);
  }
  membership_->Release(worker);
  if (draining) {
    effects->messages.push_back(Effects::Message{
        worker, record->incarnation, commands::Drain("drained: its state was handed over")});
  }
  scheduler_.Schedule(now, effects);
  return absl::OkStatus();
}

void JobManager::OnReady(JobEntry& entry, const WorkerId& worker,
                         const v1::AssignmentStatus& status, absl::Time now, Effects* effects) {
  if (entry.suspension.has_value()) return;  // a re-plan overtook it
  if (entry.ready.insert(worker).second) {
    entry.sessions_kept += status.prepare().session_kept() ? 1 : 0;
    entry.sessions_warm += status.prepare().session_warm() ? 1 : 0;
    entry.models_kept += status.prepare().model_kept() ? 1 : 0;
  }
  // The slowest member's phases: the generation was ready when it was.
  const v1::PreparePhases& phases = status.prepare();
  v1::PreparePhases& slowest = entry.slowest_prepare;
  slowest.set_build_seconds(std::max(slowest.build_seconds(), phases.build_seconds()));
  slowest.set_restore_seconds(std::max(slowest.restore_seconds(), phases.restore_seconds()));
  slowest.set_communicators_seconds(
      std::max(slowest.communicators_seconds(), phases.communicators_seconds()));
  slowest.set_session_seconds(std::max(slowest.session_seconds(), phases.session_seconds()));
  slowest.set_transfer_seconds(std::max(slowest.transfer_seconds(), phases.transfer_seconds()));
  slowest.set_mirrors_seconds(std::max(slowest.mirrors_seconds(), phases.mirrors_seconds()));
  entry.job.set_ready_workers(static_cast<int32_t>(entry.ready.size()));
  const bool all_ready = static_cast<int>(entry.ready.size()) == entry.job.mesh().members_size() &&
                         !MeshIncomplete(entry.job.mesh());
  if (all_ready) TakeEffect(entry, now, effects);
}

void JobManager::TakeEffect(JobEntry& entry, absl::Time now, Effects* effects) {
  // Every member holds this generation's state now. It may have before
  // (members re-adopted after a stall confirm it again).
  const bool took_effect = entry.job.live_state().generation() != entry.job.generation();
  v1::LiveState* live = entry.job.mutable_live_state();
  live->set_generation(entry.job.generation());
  *live->mutable_mesh() = entry.job.mesh();
  live->set_zero1(entry.job.spec().parallelism().zero1());
  live->set_optimizer_replicas(entry.job.spec().elastic().optimizer_replicas());
  // The recovery took effect: its lost steps are counted (below), and the
  // next one counts from its step. Lost members' state is obsolete.
  if (took_effect) {
    entry.reached_step = entry.job.recovery().step();
    entry.returning.clear();
  }
  entry.prepare_deadline.reset();
  std::vector<WorkerId> members;
  for (const auto& member : entry.job.mesh().members()) {
    members.push_back(WorkerId(member.worker_id()));
  }
  entry.stall.Start(members, entry.job.recovery().step(), now);
  if (entry.recovery_started.has_value()) RecordRecovery(entry, now, effects);
  if (entry.job.state() == v1::JOB_STATE_RECONFIGURING) {
    table_.SetState(entry, v1::JOB_STATE_RUNNING, "", now, effects);
    if (entry.job.generation() > 1) {
      JobTable::Emit(entry, v1::JOB_EVENT_KIND_RECOVERED, effects);
    }
    // Workers that attached while this generation restored its state were
    // left alone then; now it (or another job) may grow onto them. Without
    // this a worker back a moment after another (the second of a healed
    // host) waited as an idle spare for an unrelated event.
    scheduler_.Schedule(now, effects);
  } else {
    table_.SetMessage(entry, "", now);
    table_.Persist(entry);
    JobTable::Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
  }
}

void JobManager::RecordRecovery(JobEntry& entry, absl::Time now, Effects* effects) {
  const JobId job_id(entry.job.job_id());
  const v1::RecoveryPlan& plan = entry.job.recovery();
  Effects::Recovery recovery{job_id, plan.kind(), entry.recovery_spare, plan.lost_steps(),
                             now - *entry.recovery_started};
  v1::RecoveryStats* stats = entry.job.mutable_recovery_stats();
  if (plan.kind() == v1::RECOVERY_KIND_PEER) stats->set_peer(stats->peer() + 1);
  if (plan.kind() == v1::RECOVERY_KIND_CHECKPOINT) stats->set_checkpoint(stats->checkpoint() + 1);
  if (recovery.spare) stats->set_spare(stats->spare() + 1);
  stats->set_lost_steps(stats->lost_steps() + plan.lost_steps());
  stats->set_last_detect_to_running_seconds(absl::ToDoubleSeconds(recovery.detect_to_running));
  const absl::Time planned = entry.recovery_planned.value_or(*entry.recovery_started);
  stats->set_last_suspend_seconds(absl::ToDoubleSeconds(planned - *entry.recovery_started));
  stats->set_last_prepare_seconds(absl::ToDoubleSeconds(now - planned));
  stats->set_last_first_step_seconds(0);
  stats->set_last_detect_to_first_step_seconds(0);
  effects->recovery_phases.push_back({job_id, "suspend", planned - *entry.recovery_started});
  effects->recovery_phases.push_back({job_id, "prepare", now - planned});
  const v1::PreparePhases& slowest = entry.slowest_prepare;
  stats->set_last_build_seconds(slowest.build_seconds());
  stats->set_last_restore_seconds(slowest.restore_seconds());
  stats->set_last_sessions_kept(entry.sessions_kept);
  stats->set_last_sessions_warm(entry.sessions_warm);
  stats->set_last_models_kept(entry.models_kept);
  stats->set_last_members(entry.job.mesh().members_size());
  effects->recovery_phases.push_back({job_id, "build", absl::Seconds(slowest.build_seconds())});
  effects->recovery_phases.push_back({job_id, "restore", absl::Seconds(slowest.restore_seconds())});
  stats->set_last_communicators_seconds(slowest.communicators_seconds());
  stats->set_last_session_seconds(slowest.session_seconds());
  stats->set_last_transfer_seconds(slowest.transfer_seconds());
  stats->set_last_mirrors_seconds(slowest.mirrors_seconds());
  for (const auto& [phase, seconds] : {std::pair{"communicators", slowest.communicators_seconds()},
                                       std::pair{"session", slowest.session_seconds()},
                                       std::pair{"transfer", slowest.transfer_seconds()},
                                       std::pair{"mirrors", slowest.mirrors_seconds()}}) {
    effects->recovery_phases.push_back({job_id, phase, absl::Seconds(seconds)});
  }
  entry.first_step_wait = JobEntry::FirstStepWait{*entry.recovery_started, now, plan.step()};
  LOG(INFO) << "job " << job_id << " recovered into generation " << entry.job.generation() << " ("
            << v1::RecoveryKind_Name(plan.kind()) << (recovery.spare ? ", spare" : "") << ", "
            << plan.lost_steps() << " lost steps, " << entry.sessions_kept << " of "
            << entry.job.mesh().members_size() << " members kept their session, "
            << entry.sessions_warm << " took one prepared as warm spares, " << entry.models_kept
            << " rebuilt theirs around their model shard) "
            << absl::FormatDuration(recovery.detect_to_running) << " after the change";
  effects->recoveries.push_back(recovery);
  entry.recovery_started.reset();
  entry.recovery_planned.reset();
  entry.recovery_spare = false;
}

void JobManager::OnCompleted(JobEntry& entry, const WorkerId& worker,
                             const v1::AssignmentStatus& status, absl::Time now, Effects* effects) {
  entry.completed.insert(worker);
  // The final step's progress, which the last heartbeat may not carry.
  if (status.has_progress() && status.progress().step() > entry.job.progress().step()) {
    *entry.job.mutable_progress() = status.progress();
  }
  // Rank 0's final step joins the curve whichever member's report came
  // first (a loss of 0 is a progress without a step: nothing to add).
  if (status.has_progress() && status.progress().loss() != 0 &&
      !entry.job.mesh().members().empty() &&
      entry.job.mesh().members(0).worker_id() == worker.value()) {
    AddLossPoint(entry.history.mutable_training(), status.progress().step(),
                 status.progress().loss());
    table_.HistoryChanged(entry);
  }
  if (status.has_progress()) {
    table_.RecordValidations(entry, status.progress());
    JobTable::ShowValidations(entry);
  }
  entry.reached_step = std::max(entry.reached_step, status.progress().step());
  if (static_cast<int>(entry.completed.size()) == entry.job.mesh().members_size()) {
    Finish(entry, v1::JOB_STATE_COMPLETED, "", now, effects);
    scheduler_.Schedule(now, effects);
  }
}

void JobManager::OnFailed(JobEntry& entry, const WorkerId& worker,
                          const v1::AssignmentStatus& status, absl::Time now, Effects* effects) {
  Finish(entry, v1::JOB_STATE_FAILED,
         absl::StrCat("worker ", worker.value(), " failed: ", status.message()), now, effects);
  scheduler_.Schedule(now, effects);
}

void JobManager::OnReleased(JobEntry& entry, const WorkerId& worker, absl::Time now,
                            Effects* effects) {
  // A member leaving on its own (e.g. drained locally) is a membership change.
  RemoveMember(entry, worker);
  replanner_.Replan(entry, absl::StrCat("worker ", worker.value(), " released its assignment"),
                    /*only_if_larger=*/false, now, effects);
  scheduler_.Schedule(now, effects);
}

}  // namespace cohort::coordinator
