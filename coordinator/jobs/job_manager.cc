#include "coordinator/jobs/job_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"
#include "common/job_spec/defaults.h"
#include "common/job_spec/validator.h"
#include "common/layout/mesh_layout.h"
#include "common/log.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/jobs/loss_history.h"
#include "coordinator/jobs/mesh_planner.h"
#include "coordinator/jobs/worker_commands.h"

namespace cohort::coordinator {

bool JobManager::MeshIncomplete(const v1::Mesh& mesh) {
  return mesh.members_size() !=
         mesh.data_parallel() * mesh.tensor_parallel() * mesh.pipeline_parallel();
}

v1::CoordinatorMessage Effects::Message::WithBase(const v1::CoordinatorMessage& base,
                                                  const v1::CoordinatorMessage& message) {
  v1::CoordinatorMessage full = base;
  full.MergeFrom(message);
  return full;
}

JobManager::JobManager(Options options, MembershipTable* membership, JobStore* store)
    : options_(options), membership_(membership), store_(store) {}

std::vector<JobId> JobManager::ActiveJobs() const {
  std::vector<JobId> ids;
  ids.reserve(active_.size());
  for (const auto& [number, id] : active_) ids.push_back(id);
  return ids;
}

bool JobManager::IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

JobManager::JobEntry* JobManager::FindEntry(const JobId& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobManager::JobEntry* JobManager::FindEntry(const JobId& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

bool JobManager::IsMember(const JobEntry& entry, const WorkerId& worker) const {
  if (IsTerminal(entry.job.state())) return false;
  for (const auto& member : entry.job.mesh().members()) {
    if (member.worker_id() == worker.value()) return true;
  }
  return false;
}

absl::Status JobManager::Restore(absl::Time now) {
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->LoadAll());
  std::sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
    return std::make_pair(FromProtoTime(a.create_time()), a.job_id()) <
           std::make_pair(FromProtoTime(b.create_time()), b.job_id());
  });
  for (v1::Job& job : jobs) {
    JobId id(job.job_id());
    JobEntry& entry = NewEntry(id);
    entry.number = static_cast<int64_t>(order_.size()) + 1;
    entry.job = std::move(job);
    // A record written by a coordinator that predates a spec field gets the
    // field's default here, once: everything after reads the normalised
    // spec and applies no default of its own (common/job_spec/validator.h).
    if (absl::StatusOr<v1::JobSpec> spec = NormalizeJobSpec(entry.job.spec()); spec.ok()) {
      *entry.job.mutable_spec() = *std::move(spec);
    } else {
      LOG(WARNING) << "job " << id << ": its stored spec does not pass today's validation ("
                   << spec.status().message() << "); kept as stored";
    }
    // Likewise a mesh planned before Mesh.micro_batches existed gets the
    // split the planner makes: workers take the plan's split, never their own.
    v1::Mesh& mesh = *entry.job.mutable_mesh();
    if (const int micro_batches = MicroBatchesPerStep(entry.job.spec());
        mesh.micro_batches_size() == 0 && mesh.data_parallel() > 0 && micro_batches > 0) {
      for (const int share : layout::MicroBatchShares(micro_batches, mesh.data_parallel())) {
        mesh.add_micro_batches(share);
      }
    }
    entry.history = std::move(*entry.job.mutable_loss_history());
    entry.job.clear_loss_history();
    CountState(entry.job.state(), 1);
    if (!entry.history.validation().empty()) validated_.insert(id);
    entry.reached_step = entry.job.progress().step();
    order_.push_back(id);
    if (IsTerminal(entry.job.state())) {
      entry.finished_at = FromProtoTime(entry.job.update_time());
      finished_.emplace(*entry.finished_at, id);
      continue;
    }
    active_.emplace(entry.number, id);
    // READY reports are not persisted one by one: a fully ready mesh was
    // persisted as such; otherwise the count restarts and re-adopted workers
    // are asked again.
    if (entry.job.ready_workers() == entry.job.mesh().members_size()) {
      for (const auto& member : entry.job.mesh().members()) entry.ready.insert(WorkerId(member.worker_id()));
    } else {
      entry.job.set_ready_workers(0);
      entry.prepare_deadline = now + options_.prepare_timeout;
    }
    for (const auto& member : entry.job.mesh().members()) {
      awaiting_[WorkerId(member.worker_id())] = Awaited{id, now + options_.readopt_grace};
    }
    // Members of the live generation the old coordinator had already lost
    // may still come back with their state, as after any loss.
    for (const auto& member : entry.job.live_state().mesh().members()) {
      if (IsMember(entry, WorkerId(member.worker_id()))) continue;
      entry.returning[member.worker_id()] =
          Returning{Incarnation(member.incarnation()), member, now + RejoinGrace(entry)};
    }
  }
  if (!awaiting_.empty()) {
    LOG(INFO) << "restored " << jobs_.size() << " jobs; awaiting " << awaiting_.size()
              << " workers to re-attach within " << absl::FormatDuration(options_.readopt_grace);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::NewJob(const v1::JobSpec& spec, absl::Time now) {
  ASSIGN_OR_RETURN(v1::JobSpec normalized, NormalizeJobSpec(spec));
  v1::Job job;
  *job.mutable_spec() = std::move(normalized);
  job.set_state(v1::JOB_STATE_PENDING);
  *job.mutable_create_time() = ToProtoTime(now);
  *job.mutable_update_time() = ToProtoTime(now);
  return job;
}

std::string JobManager::NamedJobId(const v1::JobSpec& spec, int64_t number) {
  return absl::StrCat(spec.name(), "-", number);
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec, bool validate_only,
                                           absl::Time now, Effects* effects) {
  ASSIGN_OR_RETURN(v1::Job job, NewJob(spec, now));
  if (validate_only) return job;
  ASSIGN_OR_RETURN(int64_t number, store_->NextJobNumber());
  job.set_job_id(NamedJobId(job.spec(), number));
  // Persist before the job exists in memory: a failed write creates nothing.
  RETURN_IF_ERROR(store_->Put(job));
  return Admit(std::move(job), number, now, effects);
}

JobManager::JobEntry& JobManager::NewEntry(const JobId& id) {
  JobEntry& entry = jobs_[id];
  entry.reachability = Reachability({.hold = options_.partition_hold});
  return entry;
}

v1::Job JobManager::Admit(v1::Job job, int64_t number, absl::Time now, Effects* effects) {
  JobId id(job.job_id());
  JobEntry& entry = NewEntry(id);
  entry.number = number;
  entry.job = std::move(job);
  CountState(entry.job.state(), 1);
  // In number order (ListPage relies on it), which concurrent submits, each
  // numbered before it is admitted, may reach out of order.
  order_.insert(std::upper_bound(order_.begin(), order_.end(), number,
                                 [this](int64_t n, const JobId& other) {
                                   return n < jobs_.at(other).number;
                                 }),
                id);
  active_.emplace(number, id);
  LOG(INFO) << "job " << id << " submitted";
  Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
  Schedule(now, effects);
  return jobs_[id].job;
}

absl::StatusOr<v1::Job> JobManager::Get(const JobId& id) const {
  const JobEntry* entry = FindEntry(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  return entry->job;
}

const v1::Job* JobManager::Find(const JobId& id) const {
  const JobEntry* entry = FindEntry(id);
  return entry != nullptr ? &entry->job : nullptr;
}

std::vector<v1::Job> JobManager::List(bool include_finished) const {
  bool more = false;
  int64_t last = 0;
  return ListPage(include_finished, /*after=*/0, std::numeric_limits<size_t>::max(), &more, &last);
}

std::vector<v1::Job> JobManager::ListPage(bool include_finished, int64_t after, size_t limit,
                                          bool* more, int64_t* last) const {
  std::vector<v1::Job> out;
  *more = false;
  *last = after;
  // order_ is in submit order, so numbers increase along it.
  auto it = std::upper_bound(order_.begin(), order_.end(), after,
                             [this](int64_t number, const JobId& id) {
                               return number < jobs_.at(id).number;
                             });
  for (; it != order_.end(); ++it) {
    const JobEntry& entry = jobs_.at(*it);
    if (!include_finished && IsTerminal(entry.job.state())) continue;
    if (out.size() == limit) {
      *more = true;
      break;
    }
    out.push_back(entry.job);
    *last = entry.number;
  }
  return out;
}

absl::Status JobManager::Delete(const JobId& id) {
  JobEntry* entry = FindEntry(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  if (!IsTerminal(entry->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id.value(), " is ", ShortEnumName(entry->job.state()),
                     "; only a finished job can be deleted (cancel it first)"));
  }
  // The record goes first: a failed write deletes nothing.
  RETURN_IF_ERROR(store_->Delete(id.value()));
  if (entry->finished_at.has_value()) finished_.erase({*entry->finished_at, id});
  CountState(entry->job.state(), -1);
  validated_.erase(id);
  unpersisted_.erase(id);
  // order_ is in number order: the retention deletes many at a time.
  const int64_t number = entry->number;
  auto at = std::lower_bound(
      order_.begin(), order_.end(), number,
      [this](const JobId& other, int64_t n) { return jobs_.at(other).number < n; });
  if (at == order_.end() || *at != id) at = std::find(order_.begin(), order_.end(), id);
  order_.erase(at);
  jobs_.erase(id);
  LOG(INFO) << "job " << id << " deleted";
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::Cancel(const JobId& id, absl::Time now, Effects* effects) {
  JobEntry* entry = FindEntry(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  if (IsTerminal(entry->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id.value(), " already finished (", ShortEnumName(entry->job.state()), ")"));
  }
  Finish(*entry, v1::JOB_STATE_CANCELLED, "cancelled by user", now, effects);
  Schedule(now, effects);
  return entry->job;
}

absl::StatusOr<v1::Job> JobManager::Scale(const JobId& id, int min_workers, int max_workers,
                                          absl::Time now, Effects* effects) {
  JobEntry* entry = FindEntry(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  if (IsTerminal(entry->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id.value(), " already finished"));
  }
  v1::JobSpec spec = entry->job.spec();
  spec.mutable_elastic()->set_min_workers(min_workers);
  spec.mutable_elastic()->set_max_workers(max_workers);
  ASSIGN_OR_RETURN(v1::JobSpec normalized, NormalizeJobSpec(spec));
  *entry->job.mutable_spec() = std::move(normalized);
  *entry->job.mutable_update_time() = ToProtoTime(now);
  Persist(*entry);
  LOG(INFO) << "job " << id << " scaled to min " << entry->job.spec().elastic().min_workers()
            << " max " << entry->job.spec().elastic().max_workers();
  const int world = entry->job.mesh().members_size();
  const bool has_mesh = entry->job.generation() > 0;
  if (has_mesh && (world > entry->job.spec().elastic().max_workers() ||
                   world < entry->job.spec().elastic().min_workers())) {
    Replan(*entry, "scaled by user", /*only_if_larger=*/false, now, effects);
  }
  Emit(*entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
  Schedule(now, effects);
  return entry->job;
}

void JobManager::OnWorkerJoined(const v1::Hello& hello, absl::Time now, Effects* effects) {
  const WorkerId id(hello.worker_id());
  const JobId held_job(hello.held().job_id());
  auto awaited = awaiting_.find(id);
  if (awaited != awaiting_.end()) {
    const JobId job_id = awaited->second.job;
    awaiting_.erase(awaited);
    JobEntry* entry = FindEntry(job_id);
    if (entry != nullptr && !IsTerminal(entry->job.state())) {
      const v1::MeshMember* member = nullptr;
      for (const auto& m : entry->job.mesh().members()) {
        if (m.worker_id() == id.value()) member = &m;
      }
      const bool same_process = member != nullptr && member->incarnation() == hello.incarnation();
      const bool same_place = held_job == job_id &&
                              hello.held().generation() == entry->job.generation() &&
                              member != nullptr &&
                              hello.held().coordinates().rank() == member->coordinates().rank();
      if (same_process && same_place && membership_->AssignToJob(id, job_id).ok()) {
        LOG(INFO) << "worker " << id << " re-adopted into job " << job_id << " generation "
                  << entry->job.generation();
        if (entry->suspension.has_value()) {
          // A re-plan began while it was away: it suspends like the others.
          AskToSuspend(*entry, id, Incarnation(hello.incarnation()), now, effects);
        } else if (!entry->ready.contains(id)) {
          effects->messages.push_back(Effects::Message{
              id, Incarnation(hello.incarnation()),
              commands::MemberCoordinates(v1::CoordinatorMessage::kReconfigure,
                                          member->coordinates()),
              std::make_shared<const v1::CoordinatorMessage>(commands::Reconfigure(
                  job_id, Generation(entry->job.generation()), entry->job.mesh(),
                  entry->job.recovery(), entry->job.spec(), "re-adopted; confirm readiness"))});
        }
        Schedule(now, effects);
        return;
      }
      // The same process, holding a generation of this job at least as new
      // as the live state, that missed the newest generation's command (the
      // old coordinator died first): its state counts. It suspends and
      // reports what it holds, and the job is re-planned with it.
      const uint64_t held_generation = held_job == job_id ? hello.held().generation() : 0;
      const bool holds_live = same_process && held_generation != 0 &&
                              held_generation >= entry->job.live_state().generation() &&
                              held_generation <= entry->job.generation();
      if (holds_live && membership_->AssignToJob(id, job_id).ok()) {
        LOG(INFO) << "worker " << id << " re-attached holding generation " << held_generation
                  << " of job " << job_id << " (current " << entry->job.generation()
                  << "); it is re-planned with its state";
        if (entry->suspension.has_value()) {
          AskToSuspend(*entry, id, Incarnation(hello.incarnation()), now, effects);
        } else {
          BeginSuspension(*entry,
                          absl::StrCat("worker ", id.value(), " re-attached without generation ",
                                       entry->job.generation(), "'s command"),
                          /*growth=*/false, now, effects);
        }
        Schedule(now, effects);
        return;
      }
      LOG(INFO) << "worker " << id << " came back without its place in job " << job_id
                << "; treating its old self as lost";
      LostWorker lost{id, Incarnation(member ? member->incarnation() : 0), job_id,
                      LossReason::kReplaced, absl::ZeroDuration()};
      // The same process (on a new stream) stays attached, as an idle
      // worker told to drop what it holds; a fenced old process's stream
      // is cut (Coordinator::Collect).
      if (!same_process) effects->lost.push_back(lost);
      OnWorkersLost({lost}, now, effects);
    }
  }
  if (Rejoin(hello, now, effects)) {
    Schedule(now, effects);
    return;
  }
  if (!held_job.value().empty()) {
    // The worker holds an assignment this coordinator no longer gives it.
    const JobEntry* entry = FindEntry(held_job);
    const bool member_now = entry != nullptr && IsMember(*entry, id) &&
                            entry->job.generation() == hello.held().generation();
    if (!member_now) {
      // At the job's current generation: the worker may have been sent a
      // command of a newer generation than the one it holds (a Suspend while
      // it rejoined), after which a Stop of its held generation is stale.
      const uint64_t generation =
          entry != nullptr ? std::max(entry->job.generation(), hello.held().generation())
                           : hello.held().generation();
      SendStop(id, held_job, Generation(generation),
               "the coordinator no longer has this worker in that job generation", effects);
    }
  }
  Schedule(now, effects);
}

void JobManager::OnWorkersLost(const std::vector<LostWorker>& lost, absl::Time now,
                               Effects* effects) {
  // Each affected job is re-planned once, with the losses that concern it.
  std::map<JobId, std::string> reasons;
  for (const LostWorker& worker : lost) {
    if (!worker.job.has_value()) continue;
    JobEntry* entry = FindEntry(*worker.job);
    if (entry == nullptr) continue;
    if (entry->donors.erase(worker.id) > 0) {
      // A donor died: members still preparing may be waiting for its address
      // or its pieces until their own deadlines. Re-plan now.
      if (entry->job.state() != v1::JOB_STATE_RECONFIGURING) continue;
      std::string& reason = reasons[*worker.job];
      if (!reason.empty()) reason += ", ";
      absl::StrAppend(&reason, "donor ", worker.id.value(), " lost (",
                      LossReasonName(worker.reason), ")");
      continue;
    }
    if (!IsMember(*entry, worker.id)) continue;
    RememberReturning(*entry, worker, now);
    RemoveMember(*entry, worker.id);
    std::string& reason = reasons[*worker.job];
    if (!reason.empty()) reason += ", ";
    absl::StrAppend(&reason, "worker ", worker.id.value(), " lost (", LossReasonName(worker.reason),
                    ")");
  }
  for (const auto& [job_id, reason] : reasons) {
    JobEntry& entry = *FindEntry(job_id);
    if (AwaitEveryMember(entry, reason, now, effects)) continue;
    Replan(entry, reason, /*only_if_larger=*/false, now, effects);
  }
  Schedule(now, effects);
}

absl::Status JobManager::OnAssignmentStatus(const WorkerId& worker,
                                            const v1::AssignmentStatus& status, absl::Time now,
                                            Effects* effects) {
  const JobId job_id(status.job_id());
  JobEntry* entry = FindEntry(job_id);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("job ", status.job_id(), " not found"));
  }
  if (status.generation() != entry->job.generation()) {
    return absl::AbortedError(absl::StrCat("status for job ", status.job_id(), " generation ",
                                           status.generation(), " is stale: current generation is ",
                                           entry->job.generation()));
  }
  if (status.state() == v1::ASSIGNMENT_STATE_DONATED) {
    if (!entry->donors.contains(worker)) {
      // Not a donor (any more): a re-plan that began before the donation
      // ended took it into its suspension, which its SUSPENDED answers.
      return absl::AbortedError(absl::StrCat("worker ", worker.value(), " is not a donor of job ",
                                             status.job_id(), " generation ", status.generation()));
    }
    if (!status.message().empty()) {
      LOG(WARNING) << "donor " << worker << " of job " << job_id << ": " << status.message();
    }
    if (!status.message().empty() && entry->job.state() == v1::JOB_STATE_RECONFIGURING) {
      // The donation failed, so the members waiting for its pieces would wait
      // out their own deadlines: re-plan now. The donor kept its state
      // (EngineTrainer::Donate), so it stays a donor and is asked to suspend
      // with the members (BeginSuspension).
      Replan(*entry,
             absl::StrCat("donor ", worker.value(), " could not serve its state: ",
                          status.message()),
             /*only_if_larger=*/false, now, effects);
      Schedule(now, effects);
      return absl::OkStatus();
    }
    entry->donors.erase(worker);
    const WorkerRecord* record = membership_->Find(worker);
    const bool draining = record != nullptr && record->state == WorkerState::kDraining;
    if (!status.message().empty()) {
      // The generation runs without its pieces: what it kept is obsolete.
      SendStop(worker, job_id, Generation(status.generation()), "no longer a donor", effects);
    }
    membership_->Release(worker);
    if (draining) {
      effects->messages.push_back(Effects::Message{
          worker, record->incarnation, commands::Drain("drained: its state was handed over")});
    }
    Schedule(now, effects);
    return absl::OkStatus();
  }
  if (!IsMember(*entry, worker)) {
    return absl::AbortedError(absl::StrCat("worker ", worker.value(), " is not a member of job ",
                                           status.job_id(), " generation ", status.generation()));
  }
  switch (status.state()) {
    case v1::ASSIGNMENT_STATE_READY: {
      if (entry->suspension.has_value()) return absl::OkStatus();  // a re-plan overtook it
      if (entry->ready.insert(worker).second) {
        entry->sessions_kept += status.prepare().session_kept() ? 1 : 0;
        entry->sessions_warm += status.prepare().session_warm() ? 1 : 0;
        entry->models_kept += status.prepare().model_kept() ? 1 : 0;
      }
      v1::PreparePhases& slowest = entry->slowest_prepare;
      slowest.set_build_seconds(std::max(slowest.build_seconds(), status.prepare().build_seconds()));
      slowest.set_restore_seconds(
          std::max(slowest.restore_seconds(), status.prepare().restore_seconds()));
      const v1::PreparePhases& phases = status.prepare();
      slowest.set_communicators_seconds(
          std::max(slowest.communicators_seconds(), phases.communicators_seconds()));
      slowest.set_session_seconds(std::max(slowest.session_seconds(), phases.session_seconds()));
      slowest.set_transfer_seconds(std::max(slowest.transfer_seconds(), phases.transfer_seconds()));
      slowest.set_mirrors_seconds(std::max(slowest.mirrors_seconds(), phases.mirrors_seconds()));
      entry->job.set_ready_workers(static_cast<int32_t>(entry->ready.size()));
      const bool all_ready = static_cast<int>(entry->ready.size()) ==
                                 entry->job.mesh().members_size() &&
                             !MeshIncomplete(entry->job.mesh());
      if (!all_ready) return absl::OkStatus();
      // Every member holds this generation's state now. It may have before
      // (members re-adopted after a stall confirm it again).
      const bool took_effect = entry->job.live_state().generation() != entry->job.generation();
      v1::LiveState* live = entry->job.mutable_live_state();
      live->set_generation(entry->job.generation());
      *live->mutable_mesh() = entry->job.mesh();
      live->set_zero1(entry->job.spec().parallelism().zero1());
      live->set_optimizer_replicas(entry->job.spec().elastic().optimizer_replicas());
      // The recovery took effect: its lost steps are counted (below), and
      // the next one counts from its step. Lost members' state is obsolete.
      if (took_effect) {
        entry->reached_step = entry->job.recovery().step();
        entry->returning.clear();
      }
      entry->prepare_deadline.reset();
      std::vector<WorkerId> members;
      for (const auto& member : entry->job.mesh().members()) {
        members.push_back(WorkerId(member.worker_id()));
      }
      entry->stall.Start(members, entry->job.recovery().step(), now);
      if (entry->recovery_started.has_value()) {
        const v1::RecoveryPlan& plan = entry->job.recovery();
        Effects::Recovery recovery{JobId(entry->job.job_id()), plan.kind(), entry->recovery_spare,
                                   plan.lost_steps(), now - *entry->recovery_started};
        v1::RecoveryStats* stats = entry->job.mutable_recovery_stats();
        if (plan.kind() == v1::RECOVERY_KIND_PEER) stats->set_peer(stats->peer() + 1);
        if (plan.kind() == v1::RECOVERY_KIND_CHECKPOINT) {
          stats->set_checkpoint(stats->checkpoint() + 1);
        }
        if (recovery.spare) stats->set_spare(stats->spare() + 1);
        stats->set_lost_steps(stats->lost_steps() + plan.lost_steps());
        stats->set_last_detect_to_running_seconds(absl::ToDoubleSeconds(recovery.detect_to_running));
        const absl::Time planned = entry->recovery_planned.value_or(*entry->recovery_started);
        stats->set_last_suspend_seconds(absl::ToDoubleSeconds(planned - *entry->recovery_started));
        stats->set_last_prepare_seconds(absl::ToDoubleSeconds(now - planned));
        stats->set_last_first_step_seconds(0);
        stats->set_last_detect_to_first_step_seconds(0);
        effects->recovery_phases.push_back(
            {JobId(job_id), "suspend", planned - *entry->recovery_started});
        effects->recovery_phases.push_back({JobId(job_id), "prepare", now - planned});
        stats->set_last_build_seconds(entry->slowest_prepare.build_seconds());
        stats->set_last_restore_seconds(entry->slowest_prepare.restore_seconds());
        stats->set_last_sessions_kept(entry->sessions_kept);
        stats->set_last_sessions_warm(entry->sessions_warm);
        stats->set_last_models_kept(entry->models_kept);
        stats->set_last_members(entry->job.mesh().members_size());
        effects->recovery_phases.push_back(
            {JobId(job_id), "build", absl::Seconds(entry->slowest_prepare.build_seconds())});
        effects->recovery_phases.push_back(
            {JobId(job_id), "restore", absl::Seconds(entry->slowest_prepare.restore_seconds())});
        const v1::PreparePhases& slowest = entry->slowest_prepare;
        stats->set_last_communicators_seconds(slowest.communicators_seconds());
        stats->set_last_session_seconds(slowest.session_seconds());
        stats->set_last_transfer_seconds(slowest.transfer_seconds());
        stats->set_last_mirrors_seconds(slowest.mirrors_seconds());
        for (const auto& [phase, seconds] :
             {std::pair{"communicators", slowest.communicators_seconds()},
              std::pair{"session", slowest.session_seconds()},
              std::pair{"transfer", slowest.transfer_seconds()},
              std::pair{"mirrors", slowest.mirrors_seconds()}}) {
          effects->recovery_phases.push_back({JobId(job_id), phase, absl::Seconds(seconds)});
        }
        entry->first_step_wait =
            JobEntry::FirstStepWait{*entry->recovery_started, now, plan.step()};
        LOG(INFO) << "job " << job_id << " recovered into generation " << entry->job.generation()
                  << " (" << v1::RecoveryKind_Name(plan.kind()) << (recovery.spare ? ", spare" : "")
                  << ", " << plan.lost_steps() << " lost steps, " << entry->sessions_kept
                  << " of " << entry->job.mesh().members_size() << " members kept their session, "
                  << entry->sessions_warm << " took one prepared as warm spares, "
                  << entry->models_kept << " rebuilt theirs around their model shard) "
                  << absl::FormatDuration(recovery.detect_to_running) << " after the change";
        effects->recoveries.push_back(recovery);
        entry->recovery_started.reset();
        entry->recovery_planned.reset();
        entry->recovery_spare = false;
      }
      if (entry->job.state() == v1::JOB_STATE_RECONFIGURING) {
        SetState(*entry, v1::JOB_STATE_RUNNING, "", now, effects);
        if (entry->job.generation() > 1) Emit(*entry, v1::JOB_EVENT_KIND_RECOVERED, effects);
        // Workers that attached while this generation restored its state
        // were left alone then; now it (or another job) may grow onto them.
        // Without this a worker back a moment after another (the second
        // of a healed host) waited as an idle spare for an unrelated event.
        Schedule(now, effects);
      } else {
        SetMessage(*entry, "", now);
        Persist(*entry);
        Emit(*entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
      }
      return absl::OkStatus();
    }
    case v1::ASSIGNMENT_STATE_SUSPENDED:
      OnSuspended(*entry, worker, status, now, effects);
      return absl::OkStatus();
    case v1::ASSIGNMENT_STATE_COMPLETED:
      entry->completed.insert(worker);
      // The final step's progress, which the last heartbeat may not carry.
      if (status.has_progress() && status.progress().step() > entry->job.progress().step()) {
        *entry->job.mutable_progress() = status.progress();
      }
      // Rank 0's final step joins the curve whichever member's report came
      // first (a loss of 0 is a progress without a step: nothing to add).
      if (status.has_progress() && status.progress().loss() != 0 &&
          !entry->job.mesh().members().empty() &&
          entry->job.mesh().members(0).worker_id() == worker.value()) {
        AddLossPoint(entry->history.mutable_training(), status.progress().step(),
                     status.progress().loss());
        HistoryChanged(*entry);
      }
      if (status.has_progress()) {
        RecordValidations(*entry, status.progress());
        ShowValidations(*entry);
      }
      entry->reached_step = std::max(entry->reached_step, status.progress().step());
      if (static_cast<int>(entry->completed.size()) == entry->job.mesh().members_size()) {
        Finish(*entry, v1::JOB_STATE_COMPLETED, "", now, effects);
        Schedule(now, effects);
      }
      return absl::OkStatus();
    case v1::ASSIGNMENT_STATE_FAILED:
      Finish(*entry, v1::JOB_STATE_FAILED,
             absl::StrCat("worker ", worker.value(), " failed: ", status.message()), now, effects);
      Schedule(now, effects);
      return absl::OkStatus();
    case v1::ASSIGNMENT_STATE_RELEASED:
      // A member leaving on its own (e.g. drained locally) is a membership change.
      RemoveMember(*entry, worker);
      Replan(*entry, absl::StrCat("worker ", worker.value(), " released its assignment"),
             /*only_if_larger=*/false, now, effects);
      Schedule(now, effects);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("assignment status state ", static_cast<int>(status.state()),
                       " is not one of READY, COMPLETED, FAILED, RELEASED, SUSPENDED, DONATED"));
  }
}

void JobManager::OnProgress(const WorkerId& worker, const v1::Heartbeat& heartbeat,
                            absl::Time now, Effects* effects) {
  JobEntry* entry = FindEntry(JobId(heartbeat.job_id()));
  if (entry == nullptr || heartbeat.generation() != entry->job.generation() ||
      !IsMember(*entry, worker)) {
    return;
  }
  // Steps a member completed count for lost steps whenever they are heard
  // of (a suspension clears the READY set, not what was trained).
  entry->reached_step = std::max(entry->reached_step, heartbeat.progress().step());
  // Progress counts from members that restored this generation's state
  // (READY): before that a worker reports no step of its own.
  if (!entry->ready.contains(worker)) return;
  if (entry->first_step_wait.has_value() &&
      heartbeat.progress().step() > entry->first_step_wait->from_step) {
    const JobEntry::FirstStepWait wait = *entry->first_step_wait;
    entry->first_step_wait.reset();
    v1::RecoveryStats* stats = entry->job.mutable_recovery_stats();
    stats->set_last_first_step_seconds(absl::ToDoubleSeconds(now - wait.running));
    stats->set_last_detect_to_first_step_seconds(absl::ToDoubleSeconds(now - wait.started));
    effects->recovery_phases.push_back({JobId(entry->job.job_id()), "first_step", now - wait.running});
    LOG(INFO) << "job " << entry->job.job_id() << " generation " << entry->job.generation()
              << " completed its first step "
              << absl::FormatDuration(absl::Trunc(now - wait.started, absl::Milliseconds(1)))
              << " after the change (suspend " << stats->last_suspend_seconds() << " s, prepare "
              << stats->last_prepare_seconds() << " s, first step "
              << stats->last_first_step_seconds() << " s)";
  }
  entry->stall.Observe(worker, heartbeat.progress().step(),
                       heartbeat.progress().waiting_for_peers(), now);
  // Rank 0 speaks for the job; every rank computes the same loss.
  const auto& members = entry->job.mesh().members();
  if (members.empty() || members[0].worker_id() != worker.value()) return;
  const bool validated = RecordValidations(*entry, heartbeat.progress());
  if (heartbeat.progress().step() == entry->job.progress().step()) {
    // The last step's validation comes after the step.
    if (validated) {
      ShowValidations(*entry);
      Emit(*entry, v1::JOB_EVENT_KIND_PROGRESS, effects);
    }
    return;
  }
  entry->stall.ObserveStepTime(heartbeat.progress().step_time_seconds());
  *entry->job.mutable_progress() = heartbeat.progress();
  ShowValidations(*entry);
  // Rank 0's step moved on, so this progress holds the loss of a completed step.
  AddLossPoint(entry->history.mutable_training(), heartbeat.progress().step(),
               heartbeat.progress().loss());
  HistoryChanged(*entry);
  Emit(*entry, v1::JOB_EVENT_KIND_PROGRESS, effects);
}

void JobManager::OnWorkerDraining(const WorkerId& worker, const std::string& reason,
                                  absl::Time now, Effects* effects) {
  const WorkerRecord* record = membership_->Find(worker);
  if (record == nullptr || !record->job.has_value()) return;
  JobEntry* entry = FindEntry(*record->job);
  if (entry == nullptr || IsTerminal(entry->job.state())) return;
  Replan(*entry, absl::StrCat("worker ", worker.value(), " drained (", reason, ")"),
         /*only_if_larger=*/false, now, effects);
}

void JobManager::Tick(absl::Time now, Effects* effects) {
  std::vector<LostWorker> expired;
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    if (it->second.deadline <= now) {
      expired.push_back(LostWorker{it->first, Incarnation(0), it->second.job,
                                   LossReason::kHeartbeatTimeout, options_.readopt_grace,
                                   /*grace_expired=*/true});
      awaiting_.erase(it++);
    } else {
      ++it;
    }
  }
  if (!expired.empty()) {
    LOG(WARNING) << expired.size() << " workers did not re-attach within the grace period";
    effects->lost.insert(effects->lost.end(), expired.begin(), expired.end());
    OnWorkersLost(expired, now, effects);
  }
  for (const JobId& id : ActiveJobs()) {
    JobEntry& entry = jobs_.at(id);
    if (!IsTerminal(entry.job.state())) CheckTimeouts(entry, now, effects);
  }
  // unpersisted_ changes as records are written: walk a copy.
  for (const JobId& id : std::vector<JobId>(unpersisted_.begin(), unpersisted_.end())) {
    JobEntry& entry = jobs_.at(id);
    if (entry.dirty ||
        (entry.history_dirty && now - entry.history_persisted >= kHistoryPersistInterval)) {
      Persist(entry);
      entry.history_persisted = now;
    }
  }
  // Oldest first, a bounded number per tick.
  for (int deleted = 0; options_.finished_retention > absl::ZeroDuration() && deleted < 64 &&
                        !finished_.empty() &&
                        finished_.begin()->first + options_.finished_retention <= now;
       ++deleted) {
    const JobId id = finished_.begin()->second;
    if (absl::Status status = Delete(id); !status.ok()) {
      // Tried again in a minute, not on every tick.
      LOG(WARNING) << "job " << id << " is past its retention but was not deleted: " << status;
      JobEntry& entry = jobs_.at(id);
      finished_.erase(finished_.begin());
      entry.finished_at = now - options_.finished_retention + absl::Minutes(1);
      finished_.emplace(*entry.finished_at, id);
    }
  }
}

void JobManager::CheckTimeouts(JobEntry& entry, absl::Time now, Effects* effects) {
  const JobId id(entry.job.job_id());
  if (entry.reachability.TakeEnded(now) && !entry.suspension.has_value() &&
      entry.job.state() == v1::JOB_STATE_RUNNING) {
    // Workers kept apart may reach each other again: grow if they can.
    Replan(entry, "workers kept apart may reach each other again", /*only_if_larger=*/true, now,
           effects);
  }
  auto fence = [&](const std::vector<std::string>& workers, const std::string& why) {
    std::vector<LostWorker> fenced;
    for (const std::string& name : workers) {
      const WorkerId worker(name);
      const WorkerRecord* record = membership_->Find(worker);
      if (record == nullptr) continue;
      LOG(WARNING) << "fencing worker " << worker << " of job " << id << ": " << why;
      std::optional<LostWorker> lost =
          membership_->MarkLost(worker, record->incarnation, LossReason::kHang, now);
      if (lost.has_value()) fenced.push_back(*lost);
    }
    if (fenced.empty()) return;
    effects->lost.insert(effects->lost.end(), fenced.begin(), fenced.end());
    OnWorkersLost(fenced, now, effects);
  };
  if (entry.suspension.has_value()) {
    Suspension& s = *entry.suspension;
    if (!s.awaiting.empty() && now >= s.deadline) {
      std::vector<std::string> silent;
      for (const WorkerId& worker : s.awaiting) silent.push_back(worker.value());
      std::sort(silent.begin(), silent.end());
      fence(silent, absl::StrCat("no answer to Suspend within ",
                                 absl::FormatDuration(options_.suspend_timeout)));
      return;
    }
    if (s.awaiting.empty() && s.rejoin_deadline.has_value() && now >= *s.rejoin_deadline) {
      s.rejoin_deadline.reset();
      CompleteSuspension(entry, now, effects);
      return;
    }
    if (s.waiting_since.has_value() && now - *s.waiting_since >= WaitForWorkers(entry.job.spec())) {
      Finish(entry, v1::JOB_STATE_FAILED,
             absl::StrCat("waited ", absl::FormatDuration(now - *s.waiting_since),
                          " for workers (elastic.wait_for_workers_seconds): ", entry.job.message()),
             now, effects);
      Schedule(now, effects);
    }
    return;
  }
  if (entry.prepare_deadline.has_value() && now >= *entry.prepare_deadline) {
    std::vector<std::string> preparing;
    for (const auto& member : entry.job.mesh().members()) {
      if (!entry.ready.contains(WorkerId(member.worker_id()))) preparing.push_back(member.worker_id());
    }
    std::sort(preparing.begin(), preparing.end());
    entry.prepare_deadline.reset();
    if (!preparing.empty()) {
      Replan(entry,
             absl::StrCat("generation ", entry.job.generation(), " not ready within ",
                          absl::FormatDuration(options_.prepare_timeout), " (",
                          absl::StrJoin(preparing, ", "), " still preparing)"),
             /*only_if_larger=*/false, now, effects);
      return;
    }
  }
  // Stall: nobody advanced for the hang timeout.
  if (entry.job.state() != v1::JOB_STATE_RUNNING ||
      entry.job.progress().step() >= entry.job.spec().steps()) {
    return;
  }
  const std::optional<StallDetector::Stall> stall = entry.stall.Check(
      now, StallDetector::Options{options_.hang_timeout_floor, options_.hang_step_multiple});
  if (!stall.has_value()) return;
  fence(stall->stuck, absl::StrCat("the job made no progress for ",
                                   absl::FormatDuration(stall->idle),
                                   " and this member is not waiting for peers"));
}

void JobManager::Discount(absl::Duration gap, absl::Time now) {
  for (auto& [worker, awaited] : awaiting_) awaited.deadline += gap;
  for (auto& [id, entry] : jobs_) {
    for (auto& [worker, returning] : entry.returning) returning.deadline += gap;
    if (entry.prepare_deadline.has_value()) *entry.prepare_deadline += gap;
    entry.stall.Discount(gap, now);
    if (!entry.suspension.has_value()) continue;
    Suspension& s = *entry.suspension;
    s.deadline += gap;
    if (s.rejoin_deadline.has_value()) *s.rejoin_deadline += gap;
    if (s.waiting_since.has_value()) *s.waiting_since = std::min(*s.waiting_since + gap, now);
  }
}

absl::StatusOr<Generation> JobManager::CurrentGeneration(const JobId& id) const {
  const JobEntry* entry = FindEntry(id);
  if (entry == nullptr || IsTerminal(entry->job.state())) {
    return absl::NotFoundError(absl::StrCat("job ", id.value(), " is not active"));
  }
  return Generation(entry->job.generation());
}

bool JobManager::RecordValidations(JobEntry& entry, const v1::Progress& progress) {
  if (!MergeNewerPoints(entry.history.mutable_validation(), progress.validation())) return false;
  HistoryChanged(entry);
  validated_.insert(JobId(entry.job.job_id()));
  return true;
}

void JobManager::ShowValidations(JobEntry& entry) {
  const LossSeries& all = entry.history.validation();
  const int shown = std::min(all.size(), kRecentValidationsShown);
  LossSeries* recent = entry.job.mutable_progress()->mutable_validation();
  recent->Clear();
  for (int i = all.size() - shown; i < all.size(); ++i) *recent->Add() = all.Get(i);
}

absl::StatusOr<v1::LossHistory> JobManager::LossHistory(const JobId& id) const {
  const JobEntry* entry = FindEntry(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  return entry->history;
}

std::map<std::string, double> JobManager::LatestValidationLosses() const {
  std::map<std::string, double> losses;
  for (const JobId& id : validated_) {
    const LossSeries& validation = jobs_.at(id).history.validation();
    if (!validation.empty()) losses[id.value()] = validation.Get(validation.size() - 1).loss();
  }
  return losses;
}

std::map<v1::JobState, int> JobManager::CountByState() const { return state_counts_; }

void JobManager::HistoryChanged(JobEntry& entry) {
  entry.history_dirty = true;
  unpersisted_.insert(JobId(entry.job.job_id()));
}

void JobManager::TrackUnpersisted(const JobEntry& entry) {
  const JobId id(entry.job.job_id());
  if (entry.dirty || entry.history_dirty) {
    unpersisted_.insert(id);
  } else {
    unpersisted_.erase(id);
  }
}

void JobManager::CountState(v1::JobState state, int delta) {
  if ((state_counts_[state] += delta) == 0) state_counts_.erase(state);
}

void JobManager::Finish(JobEntry& entry, v1::JobState state, const std::string& message,
                        absl::Time now, Effects* effects) {
  const JobId id(entry.job.job_id());
  if (entry.finished_at.has_value()) finished_.erase({*entry.finished_at, id});
  entry.finished_at = now;
  finished_.emplace(now, id);
  active_.erase(entry.number);
  for (const auto& member : entry.job.mesh().members()) {
    const WorkerId worker(member.worker_id());
    const WorkerRecord* record = membership_->Find(worker);
    if (record != nullptr && record->job == id && record->state != WorkerState::kLost) {
      SendStop(worker, id, Generation(entry.job.generation()),
               message.empty() ? v1::JobState_Name(state) : message, effects);
      membership_->Release(worker);
    }
  }
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    if (it->second.job == id) {
      awaiting_.erase(it++);
    } else {
      ++it;
    }
  }
  for (const WorkerId& donor : entry.donors) {
    const WorkerRecord* record = membership_->Find(donor);
    if (record != nullptr && record->job == id && record->state != WorkerState::kLost) {
      SendStop(donor, id, Generation(entry.job.generation()), "job finished", effects);
      membership_->Release(donor);
    }
  }
  entry.donors.clear();
  entry.returning.clear();
  entry.prepare_deadline.reset();
  entry.suspension.reset();
  effects->finished_jobs.push_back(id);
  SetState(entry, state, message, now, effects);
  LOG(INFO) << "job " << id << " " << v1::JobState_Name(state)
            << (message.empty() ? "" : ": " + message);
}

void JobManager::RemoveMember(JobEntry& entry, const WorkerId& worker) {
  auto* members = entry.job.mutable_mesh()->mutable_members();
  for (int i = 0; i < members->size(); ++i) {
    if (members->Get(i).worker_id() == worker.value()) {
      members->erase(members->begin() + i);
      break;
    }
  }
  entry.ready.erase(worker);
  entry.completed.erase(worker);
  entry.stall.Remove(worker);
  entry.job.set_ready_workers(static_cast<int32_t>(entry.ready.size()));
  if (entry.suspension.has_value()) {
    entry.suspension->awaiting.erase(worker);
    entry.suspension->holders.erase(worker.value());
  }
  const WorkerRecord* record = membership_->Find(worker);
  if (record != nullptr && record->job == JobId(entry.job.job_id())) membership_->Release(worker);
}

void JobManager::SetState(JobEntry& entry, v1::JobState state, const std::string& message,
                          absl::Time now, Effects* effects) {
  CountState(entry.job.state(), -1);
  CountState(state, 1);
  entry.job.set_state(state);
  entry.job.set_message(message);
  *entry.job.mutable_update_time() = ToProtoTime(now);
  Persist(entry);
  Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
}

void JobManager::SetMessage(JobEntry& entry, const std::string& message, absl::Time now) {
  if (entry.job.message() == message) return;
  entry.job.set_message(message);
  *entry.job.mutable_update_time() = ToProtoTime(now);
  Persist(entry);
}

void JobManager::Persist(JobEntry& entry) {
  v1::Job record = entry.job;
  *record.mutable_loss_history() = entry.history;
  absl::Status status = store_->Put(record);
  entry.dirty = !status.ok();
  if (status.ok()) entry.history_dirty = false;
  TrackUnpersisted(entry);
  if (!status.ok()) {
    LOG(ERROR) << "cannot persist job " << entry.job.job_id() << " (will retry): " << status;
  }
}

void JobManager::Emit(const JobEntry& entry, v1::JobEventKind kind, Effects* effects) const {
  effects->events.push_back(Effects::Event{kind, entry.job});
}

void JobManager::SendStop(const WorkerId& worker, const JobId& job, Generation generation,
                          const std::string& reason, Effects* effects) const {
  const WorkerRecord* record = membership_->Find(worker);
  if (record == nullptr || record->state == WorkerState::kLost) return;
  effects->messages.push_back(
      Effects::Message{worker, record->incarnation, commands::Stop(job, generation, reason)});
}

std::string JobManager::NoneAttached(v1::DeviceKind kind) const {
  if (membership_->CountAttached(kind) > 0) return "";
  return absl::StrCat(" (no ", ShortEnumName(kind), " worker is attached)");
}

std::optional<int64_t> JobManager::LatestCheckpoint(const JobId& id) const {
  if (!options_.latest_checkpoint) return std::nullopt;
  const std::optional<Step> step = options_.latest_checkpoint(id);
  return step.has_value() ? std::optional<int64_t>(step->value()) : std::nullopt;
}

PlannerWorker JobManager::ToPlannerWorker(const WorkerRecord& record) {
  return PlannerWorker{record.id, record.incarnation, record.host, record.device_index};
}

PlanRequest JobManager::MakePlanRequest(const v1::JobSpec& spec) {
  PlanRequest request;
  request.tensor = spec.parallelism().tensor();
  request.pipeline = spec.parallelism().pipeline();
  request.min_workers = spec.elastic().min_workers();
  request.max_workers = spec.elastic().max_workers();
  request.micro_batches = MicroBatchesPerStep(spec);
  request.even_shares =
      spec.parallelism().reduction() == v1::ParallelismConfig::REDUCTION_TRANSPORT;
  return request;
}

void JobManager::AppendIdleCandidates(const v1::JobSpec& spec, PlanRequest* request) const {
  // Idle workers in (host, device) order, whole hosts at a time, until the
  // job's largest mesh could be filled from them alone: planning stays
  // proportional to the job, not to the cluster (a one-worker job among
  // 10,000 idle workers looked at all of them). The shape is the same as
  // with every idle worker, since it can never exceed max_workers.
  const size_t enough = request->candidates.size() +
                        static_cast<size_t>(std::max({spec.elastic().max_workers(),
                                                      spec.elastic().min_workers(), 1}));
  const std::string* host = nullptr;
  membership_->ForEachIdle(spec.device_kind(), [&](const WorkerRecord& record) {
    if (request->candidates.size() >= enough && (host == nullptr || record.host != *host)) {
      return false;
    }
    request->candidates.push_back(ToPlannerWorker(record));
    host = &record.host;
    return true;
  });
}

void JobManager::Schedule(absl::Time now, Effects* effects) {
  absl::flat_hash_set<JobId> awaited_jobs;
  for (const auto& [worker, awaited] : awaiting_) awaited_jobs.insert(awaited.job);
  for (const JobId& id : ActiveJobs()) {
    JobEntry& entry = jobs_.at(id);
    const v1::JobState state = entry.job.state();
    if (IsTerminal(state) || awaited_jobs.contains(id)) continue;
    const v1::DeviceKind kind = entry.job.spec().device_kind();
    if (state == v1::JOB_STATE_PENDING) {
      PlanRequest request = MakePlanRequest(entry.job.spec());
      AppendIdleCandidates(entry.job.spec(), &request);
      absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
      if (!mesh.ok()) {
        SetMessage(entry,
                   absl::StrCat("waiting for workers: ", mesh.status().message(),
                                NoneAttached(entry.job.spec().device_kind())),
                   now);
        continue;
      }
      RecoveryInput input;  // no live state: a checkpoint if there is one
      input.next_mesh = *mesh;
      input.checkpoint_step = LatestCheckpoint(id);
      v1::RecoveryPlan plan = PlanRecovery(input);
      plan.set_lost_steps(0);
      ApplyMesh(entry, *std::move(mesh), "job started", plan, now, effects);
      continue;
    }
    if (!membership_->HasIdle(kind)) continue;
    if (entry.suspension.has_value()) {
      // Waiting for workers after a loss: try again with the new ones.
      if (entry.suspension->awaiting.empty()) CompleteSuspension(entry, now, effects);
      continue;
    }
    // A generation still restoring its state is left alone.
    if (entry.job.state() == v1::JOB_STATE_RECONFIGURING && !MeshIncomplete(entry.job.mesh())) {
      continue;
    }
    const bool incomplete = MeshIncomplete(entry.job.mesh());
    if (!incomplete && entry.job.mesh().members_size() >= entry.job.spec().elastic().max_workers()) {
      continue;
    }
    Replan(entry, incomplete ? "workers available" : "growing toward max_workers",
           /*only_if_larger=*/!incomplete, now, effects);
  }
  UpdateWarmSpares(effects);
}

}  // namespace cohort::coordinator
