#include "coordinator/jobs/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"
#include "common/job_spec/defaults.h"
#include "common/job_spec/validator.h"
#include "common/layout/mesh_layout.h"
#include "common/log.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/jobs/loss_history.h"

namespace cohort::coordinator {

JobEntry& JobTable::NewEntry(const JobId& id) {
  JobEntry& entry = jobs_[id];
  entry.reachability = Reachability({.hold = options_.partition_hold});
  return entry;
}

absl::StatusOr<std::vector<JobId>> JobTable::Load() {
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->LoadAll());
  std::sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
    return std::make_pair(FromProtoTime(a.create_time()), a.job_id()) <
           std::make_pair(FromProtoTime(b.create_time()), b.job_id());
  });
  std::vector<JobId> restored;
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
    restored.push_back(id);
  }
  return restored;
}

JobEntry& JobTable::Add(v1::Job job, int64_t number) {
  JobId id(job.job_id());
  JobEntry& entry = NewEntry(id);
  entry.number = number;
  entry.job = std::move(job);
  CountState(entry.job.state(), 1);
  // In number order (ListPage relies on it), which concurrent submits, each
  // numbered before it is admitted, may reach out of order.
  order_.insert(std::upper_bound(
                    order_.begin(), order_.end(), number,
                    [this](int64_t n, const JobId& other) { return n < jobs_.at(other).number; }),
                id);
  active_.emplace(number, id);
  return entry;
}

JobEntry* JobTable::Find(const JobId& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobEntry* JobTable::Find(const JobId& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<JobId> JobTable::ActiveJobs() const {
  std::vector<JobId> ids;
  ids.reserve(active_.size());
  for (const auto& [number, id] : active_) ids.push_back(id);
  return ids;
}

std::vector<v1::Job> JobTable::ListPage(bool include_finished, int64_t after, size_t limit,
                                        bool* more, int64_t* last) const {
  std::vector<v1::Job> out;
  *more = false;
  *last = after;
  // order_ is in submit order, so numbers increase along it.
  auto it = std::upper_bound(
      order_.begin(), order_.end(), after,
      [this](int64_t number, const JobId& id) { return number < jobs_.at(id).number; });
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

absl::Status JobTable::Delete(const JobId& id) {
  JobEntry* entry = Find(id);
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

void JobTable::MarkFinished(JobEntry& entry, absl::Time now) {
  const JobId id(entry.job.job_id());
  if (entry.finished_at.has_value()) finished_.erase({*entry.finished_at, id});
  entry.finished_at = now;
  finished_.emplace(now, id);
  active_.erase(entry.number);
}

void JobTable::DeleteExpired(absl::Time now, absl::Duration retention) {
  // Oldest first, a bounded number per call.
  for (int deleted = 0; retention > absl::ZeroDuration() && deleted < 64 && !finished_.empty() &&
                        finished_.begin()->first + retention <= now;
       ++deleted) {
    const JobId id = finished_.begin()->second;
    if (absl::Status status = Delete(id); !status.ok()) {
      // Tried again in a minute, not on every tick.
      LOG(WARNING) << "job " << id << " is past its retention but was not deleted: " << status;
      JobEntry& entry = jobs_.at(id);
      finished_.erase(finished_.begin());
      entry.finished_at = now - retention + absl::Minutes(1);
      finished_.emplace(*entry.finished_at, id);
    }
  }
}

void JobTable::SetState(JobEntry& entry, v1::JobState state, const std::string& message,
                        absl::Time now, Effects* effects) {
  CountState(entry.job.state(), -1);
  CountState(state, 1);
  entry.job.set_state(state);
  entry.job.set_message(message);
  *entry.job.mutable_update_time() = ToProtoTime(now);
  Persist(entry);
  Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
}

void JobTable::SetMessage(JobEntry& entry, const std::string& message, absl::Time now) {
  if (entry.job.message() == message) return;
  entry.job.set_message(message);
  *entry.job.mutable_update_time() = ToProtoTime(now);
  Persist(entry);
}

void JobTable::Persist(JobEntry& entry) {
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

void JobTable::MarkBehind(JobEntry& entry) {
  // The next tick writes the record (within 50 ms): a commit's reply, and
  // the coordinator's lock it is reported under, need not wait for a synced
  // write of the whole record, loss history included.
  entry.dirty = true;
  TrackUnpersisted(entry);
}

void JobTable::HistoryChanged(JobEntry& entry) {
  entry.history_dirty = true;
  unpersisted_.insert(JobId(entry.job.job_id()));
}

void JobTable::TrackUnpersisted(const JobEntry& entry) {
  const JobId id(entry.job.job_id());
  if (entry.dirty || entry.history_dirty) {
    unpersisted_.insert(id);
  } else {
    unpersisted_.erase(id);
  }
}

void JobTable::WriteBehind(absl::Time now) {
  // unpersisted_ changes as records are written: walk a copy.
  for (const JobId& id : std::vector<JobId>(unpersisted_.begin(), unpersisted_.end())) {
    JobEntry& entry = jobs_.at(id);
    if (entry.dirty ||
        (entry.history_dirty && now - entry.history_persisted >= kHistoryPersistInterval)) {
      Persist(entry);
      entry.history_persisted = now;
    }
  }
}

void JobTable::Emit(const JobEntry& entry, v1::JobEventKind kind, Effects* effects) {
  effects->events.push_back(Effects::Event{kind, entry.job});
}

bool JobTable::RecordValidations(JobEntry& entry, const v1::Progress& progress) {
  if (!MergeNewerPoints(entry.history.mutable_validation(), progress.validation())) return false;
  HistoryChanged(entry);
  validated_.insert(JobId(entry.job.job_id()));
  return true;
}

void JobTable::ShowValidations(JobEntry& entry) {
  const LossSeries& all = entry.history.validation();
  const int shown = std::min(all.size(), kRecentValidationsShown);
  LossSeries* recent = entry.job.mutable_progress()->mutable_validation();
  recent->Clear();
  for (int i = all.size() - shown; i < all.size(); ++i) *recent->Add() = all.Get(i);
}

std::map<std::string, double> JobTable::LatestValidationLosses() const {
  std::map<std::string, double> losses;
  for (const JobId& id : validated_) {
    const LossSeries& validation = jobs_.at(id).history.validation();
    if (!validation.empty()) losses[id.value()] = validation.Get(validation.size() - 1).loss();
  }
  return losses;
}

void JobTable::CountState(v1::JobState state, int delta) {
  if ((state_counts_[state] += delta) == 0) state_counts_.erase(state);
}

}  // namespace cohort::coordinator
