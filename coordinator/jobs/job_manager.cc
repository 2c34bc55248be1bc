// JobManager: the job lifecycle (submit, cancel, scale, finish), losses,
// progress and timeouts; the decisions are routed to JobTable, Scheduler,
// Replanner and WarmSpares (job_manager.h, "Where it lives").

#include "coordinator/jobs/job_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"
#include "common/job_spec/defaults.h"
#include "common/job_spec/validator.h"
#include "common/log.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_workers.h"
#include "coordinator/jobs/loss_history.h"

namespace cohort::coordinator {

JobManager::JobManager(Options options, MembershipTable* membership, JobStore* store)
    : options_(options),
      membership_(membership),
      store_(store),
      table_(JobTable::Options{.partition_hold = options_.partition_hold}, store),
      warm_(WarmSpares::Options{.per_job = options_.warm_spares_per_job}, &table_, membership),
      replanner_(Replanner::Options{.readopt_grace = options_.readopt_grace,
                                    .suspend_timeout = options_.suspend_timeout,
                                    .stream_rejoin_grace = options_.stream_rejoin_grace,
                                    .prepare_timeout = options_.prepare_timeout,
                                    .latest_checkpoint = options_.latest_checkpoint},
                 &table_, membership, &warm_),
      scheduler_(&table_, membership, &replanner_, &warm_) {}

absl::Status JobManager::Restore(absl::Time now) {
  ASSIGN_OR_RETURN(const std::vector<JobId> restored, table_.Load());
  auto& awaiting = table_.awaiting();
  for (const JobId& id : restored) {
    JobEntry& entry = table_.At(id);
    // READY reports are not persisted one by one: a fully ready mesh was
    // persisted as such; otherwise the count restarts and re-adopted workers
    // are asked again.
    if (entry.job.ready_workers() == entry.job.mesh().members_size()) {
      for (const auto& member : entry.job.mesh().members()) {
        entry.ready.insert(WorkerId(member.worker_id()));
      }
    } else {
      entry.job.set_ready_workers(0);
      entry.prepare_deadline = now + options_.prepare_timeout;
    }
    for (const auto& member : entry.job.mesh().members()) {
      awaiting[WorkerId(member.worker_id())] = Awaited{id, now + options_.readopt_grace};
    }
    // Members of the live generation the old coordinator had already lost
    // may still come back with their state, as after any loss.
    for (const auto& member : entry.job.live_state().mesh().members()) {
      if (IsMember(entry, WorkerId(member.worker_id()))) continue;
      entry.returning[member.worker_id()] =
          Returning{Incarnation(member.incarnation()), member, now + replanner_.RejoinGrace(entry)};
    }
  }
  if (!awaiting.empty()) {
    LOG(INFO) << "restored " << table_.size() << " jobs; awaiting " << awaiting.size()
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

v1::Job JobManager::Admit(v1::Job job, int64_t number, absl::Time now, Effects* effects) {
  const JobId id(job.job_id());
  JobEntry& entry = table_.Add(std::move(job), number);
  LOG(INFO) << "job " << id << " submitted";
  JobTable::Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
  scheduler_.Schedule(now, effects);
  return table_.At(id).job;
}

absl::StatusOr<v1::Job> JobManager::Get(const JobId& id) const {
  const JobEntry* entry = table_.Find(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  return entry->job;
}

const v1::Job* JobManager::Find(const JobId& id) const {
  const JobEntry* entry = table_.Find(id);
  return entry != nullptr ? &entry->job : nullptr;
}

std::vector<v1::Job> JobManager::List(bool include_finished) const {
  bool more = false;
  int64_t last = 0;
  return ListPage(include_finished, /*after=*/0, std::numeric_limits<size_t>::max(), &more, &last);
}

std::vector<v1::Job> JobManager::ListPage(bool include_finished, int64_t after, size_t limit,
                                          bool* more, int64_t* last) const {
  return table_.ListPage(include_finished, after, limit, more, last);
}

absl::Status JobManager::Delete(const JobId& id) { return table_.Delete(id); }

absl::StatusOr<v1::Job> JobManager::Cancel(const JobId& id, absl::Time now, Effects* effects) {
  JobEntry* entry = table_.Find(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  if (IsTerminal(entry->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id.value(), " already finished (",
                                                      ShortEnumName(entry->job.state()), ")"));
  }
  Finish(*entry, v1::JOB_STATE_CANCELLED, "cancelled by user", now, effects);
  scheduler_.Schedule(now, effects);
  return entry->job;
}

absl::StatusOr<v1::Job> JobManager::Scale(const JobId& id, int min_workers, int max_workers,
                                          absl::Time now, Effects* effects) {
  JobEntry* entry = table_.Find(id);
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
  table_.Persist(*entry);
  LOG(INFO) << "job " << id << " scaled to min " << entry->job.spec().elastic().min_workers()
            << " max " << entry->job.spec().elastic().max_workers();
  const int world = entry->job.mesh().members_size();
  const bool has_mesh = entry->job.generation() > 0;
  if (has_mesh && (world > entry->job.spec().elastic().max_workers() ||
                   world < entry->job.spec().elastic().min_workers())) {
    replanner_.Replan(*entry, "scaled by user", /*only_if_larger=*/false, now, effects);
  }
  JobTable::Emit(*entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
  scheduler_.Schedule(now, effects);
  return entry->job;
}

void JobManager::OnWorkersLost(const std::vector<LostWorker>& lost, absl::Time now,
                               Effects* effects) {
  // Each affected job is re-planned once, with the losses that concern it.
  std::map<JobId, std::string> reasons;
  for (const LostWorker& worker : lost) {
    if (!worker.job.has_value()) continue;
    JobEntry* entry = table_.Find(*worker.job);
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
    replanner_.RememberReturning(*entry, worker, now);
    RemoveMember(*entry, worker.id);
    std::string& reason = reasons[*worker.job];
    if (!reason.empty()) reason += ", ";
    absl::StrAppend(&reason, "worker ", worker.id.value(), " lost (", LossReasonName(worker.reason),
                    ")");
  }
  for (const auto& [job_id, reason] : reasons) {
    JobEntry& entry = *table_.Find(job_id);
    if (replanner_.AwaitEveryMember(entry, reason, now, effects)) continue;
    replanner_.Replan(entry, reason, /*only_if_larger=*/false, now, effects);
  }
  scheduler_.Schedule(now, effects);
}

void JobManager::OnProgress(const WorkerId& worker, const v1::Heartbeat& heartbeat, absl::Time now,
                            Effects* effects) {
  JobEntry* entry = table_.Find(JobId(heartbeat.job_id()));
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
    effects->recovery_phases.push_back(
        {JobId(entry->job.job_id()), "first_step", now - wait.running});
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
  const bool validated = table_.RecordValidations(*entry, heartbeat.progress());
  if (heartbeat.progress().step() == entry->job.progress().step()) {
    // The last step's validation comes after the step.
    if (validated) {
      JobTable::ShowValidations(*entry);
      JobTable::Emit(*entry, v1::JOB_EVENT_KIND_PROGRESS, effects);
    }
    return;
  }
  entry->stall.ObserveStepTime(heartbeat.progress().step_time_seconds());
  *entry->job.mutable_progress() = heartbeat.progress();
  JobTable::ShowValidations(*entry);
  // Rank 0's step moved on, so this progress holds the loss of a completed step.
  AddLossPoint(entry->history.mutable_training(), heartbeat.progress().step(),
               heartbeat.progress().loss());
  table_.HistoryChanged(*entry);
  JobTable::Emit(*entry, v1::JOB_EVENT_KIND_PROGRESS, effects);
}

void JobManager::OnWorkerDraining(const WorkerId& worker, const std::string& reason, absl::Time now,
                                  Effects* effects) {
  const WorkerRecord* record = membership_->Find(worker);
  if (record == nullptr || !record->job.has_value()) return;
  JobEntry* entry = table_.Find(*record->job);
  if (entry == nullptr || IsTerminal(entry->job.state())) return;
  replanner_.Replan(*entry, absl::StrCat("worker ", worker.value(), " drained (", reason, ")"),
                    /*only_if_larger=*/false, now, effects);
}

void JobManager::Tick(absl::Time now, Effects* effects) {
  std::vector<LostWorker> expired;
  auto& awaiting = table_.awaiting();
  for (auto it = awaiting.begin(); it != awaiting.end();) {
    if (it->second.deadline <= now) {
      expired.push_back(LostWorker{it->first, Incarnation(0), it->second.job,
                                   LossReason::kHeartbeatTimeout, options_.readopt_grace,
                                   /*grace_expired=*/true});
      awaiting.erase(it++);
    } else {
      ++it;
    }
  }
  if (!expired.empty()) {
    LOG(WARNING) << expired.size() << " workers did not re-attach within the grace period";
    effects->lost.insert(effects->lost.end(), expired.begin(), expired.end());
    OnWorkersLost(expired, now, effects);
  }
  for (const JobId& id : table_.ActiveJobs()) {
    JobEntry& entry = table_.At(id);
    if (!IsTerminal(entry.job.state())) CheckTimeouts(entry, now, effects);
  }
  table_.WriteBehind(now);
  table_.DeleteExpired(now, options_.finished_retention);
}

void JobManager::Fence(const JobId& id, const std::vector<std::string>& workers,
                       const std::string& why, absl::Time now, Effects* effects) {
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
}

void JobManager::CheckTimeouts(JobEntry& entry, absl::Time now, Effects* effects) {
  const JobId id(entry.job.job_id());
  if (entry.reachability.TakeEnded(now) && !entry.suspension.has_value() &&
      entry.job.state() == v1::JOB_STATE_RUNNING) {
    // Workers kept apart may reach each other again: grow if they can.
    replanner_.Replan(entry, "workers kept apart may reach each other again",
                      /*only_if_larger=*/true, now, effects);
  }
  if (entry.suspension.has_value()) {
    Suspension& s = *entry.suspension;
    if (!s.awaiting.empty() && now >= s.deadline) {
      std::vector<std::string> silent;
      for (const WorkerId& worker : s.awaiting) silent.push_back(worker.value());
      std::sort(silent.begin(), silent.end());
      Fence(id, silent,
            absl::StrCat("no answer to Suspend within ",
                         absl::FormatDuration(options_.suspend_timeout)),
            now, effects);
      return;
    }
    if (s.awaiting.empty() && s.rejoin_deadline.has_value() && now >= *s.rejoin_deadline) {
      s.rejoin_deadline.reset();
      replanner_.CompleteSuspension(entry, now, effects);
      return;
    }
    if (s.waiting_since.has_value() && now - *s.waiting_since >= WaitForWorkers(entry.job.spec())) {
      Finish(entry, v1::JOB_STATE_FAILED,
             absl::StrCat("waited ", absl::FormatDuration(now - *s.waiting_since),
                          " for workers (elastic.wait_for_workers_seconds): ", entry.job.message()),
             now, effects);
      scheduler_.Schedule(now, effects);
    }
    return;
  }
  if (entry.prepare_deadline.has_value() && now >= *entry.prepare_deadline) {
    std::vector<std::string> preparing;
    for (const auto& member : entry.job.mesh().members()) {
      if (!entry.ready.contains(WorkerId(member.worker_id())))
        preparing.push_back(member.worker_id());
    }
    std::sort(preparing.begin(), preparing.end());
    entry.prepare_deadline.reset();
    if (!preparing.empty()) {
      replanner_.Replan(entry,
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
  Fence(id, stall->stuck,
        absl::StrCat("the job made no progress for ", absl::FormatDuration(stall->idle),
                     " and this member is not waiting for peers"),
        now, effects);
}

void JobManager::Discount(absl::Duration gap, absl::Time now) {
  for (auto& [worker, awaited] : table_.awaiting()) awaited.deadline += gap;
  table_.ForEach([&](JobEntry& entry) {
    for (auto& [worker, returning] : entry.returning) returning.deadline += gap;
    if (entry.prepare_deadline.has_value()) *entry.prepare_deadline += gap;
    entry.stall.Discount(gap, now);
    if (!entry.suspension.has_value()) return;
    Suspension& s = *entry.suspension;
    s.deadline += gap;
    if (s.rejoin_deadline.has_value()) *s.rejoin_deadline += gap;
    if (s.waiting_since.has_value()) *s.waiting_since = std::min(*s.waiting_since + gap, now);
  });
}

absl::StatusOr<Generation> JobManager::CurrentGeneration(const JobId& id) const {
  const JobEntry* entry = table_.Find(id);
  if (entry == nullptr || IsTerminal(entry->job.state())) {
    return absl::NotFoundError(absl::StrCat("job ", id.value(), " is not active"));
  }
  return Generation(entry->job.generation());
}

absl::StatusOr<v1::LossHistory> JobManager::LossHistory(const JobId& id) const {
  const JobEntry* entry = table_.Find(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", id.value(), " not found"));
  return entry->history;
}

std::map<std::string, double> JobManager::LatestValidationLosses() const {
  return table_.LatestValidationLosses();
}

std::map<v1::JobState, int> JobManager::CountByState() const { return table_.CountByState(); }

void JobManager::Finish(JobEntry& entry, v1::JobState state, const std::string& message,
                        absl::Time now, Effects* effects) {
  const JobId id(entry.job.job_id());
  table_.MarkFinished(entry, now);
  for (const auto& member : entry.job.mesh().members()) {
    const WorkerId worker(member.worker_id());
    const WorkerRecord* record = membership_->Find(worker);
    if (record != nullptr && record->job == id && record->state != WorkerState::kLost) {
      SendStop(*membership_, worker, id, Generation(entry.job.generation()),
               message.empty() ? v1::JobState_Name(state) : message, effects);
      membership_->Release(worker);
    }
  }
  auto& awaiting = table_.awaiting();
  for (auto it = awaiting.begin(); it != awaiting.end();) {
    if (it->second.job == id) {
      awaiting.erase(it++);
    } else {
      ++it;
    }
  }
  for (const WorkerId& donor : entry.donors) {
    const WorkerRecord* record = membership_->Find(donor);
    if (record != nullptr && record->job == id && record->state != WorkerState::kLost) {
      SendStop(*membership_, donor, id, Generation(entry.job.generation()), "job finished",
               effects);
      membership_->Release(donor);
    }
  }
  entry.donors.clear();
  entry.returning.clear();
  entry.prepare_deadline.reset();
  entry.suspension.reset();
  effects->finished_jobs.push_back(id);
  table_.SetState(entry, state, message, now, effects);
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

}  // namespace cohort::coordinator
