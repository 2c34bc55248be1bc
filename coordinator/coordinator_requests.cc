// The Coordinator facade's request handlers: workers and jobs listed,
// drained, submitted, cancelled, scaled and watched, checkpoint outcomes, and
// the KeyValue store (coordinator.cc holds the workers' streams, the tick and
// how effects are delivered).

#include <limits>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_spec/validator.h"
#include "common/log.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"
#include "coordinator/jobs/worker_commands.h"
#include "coordinator/paging.h"

namespace cohort::coordinator {
namespace {

v1::WorkerState ToProtoState(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle: return v1::WORKER_STATE_IDLE;
    case WorkerState::kAssigned: return v1::WORKER_STATE_ASSIGNED;
    case WorkerState::kLost: return v1::WORKER_STATE_LOST;
    case WorkerState::kDraining: return v1::WORKER_STATE_DRAINING;
  }
  return v1::WORKER_STATE_UNSPECIFIED;
}

std::string ScopeString(const KvScope& scope) {
  return absl::StrCat(scope.job.value(), "@", scope.generation.value());
}

}  // namespace

template <typename F>
auto Coordinator::WithEffects(F&& f) -> decltype(f(std::declval<Effects*>())) {
  Deliveries deliveries;
  decltype(f(std::declval<Effects*>())) result;
  {
    SectionLock lock(this, LockSection::kJobs);
    Effects effects;
    result = f(&effects);
    Collect(std::move(effects), &deliveries);
  }
  deliveries.Run().IgnoreError();  // logged; the writes stay queued
  return result;
}

std::vector<v1::WorkerInfo> Coordinator::ListWorkers() const {
  SectionLock lock(this, LockSection::kRead);
  bool more = false;
  return ListWorkersLocked("", std::numeric_limits<size_t>::max(), &more);
}

absl::StatusOr<v1::ListWorkersResponse> Coordinator::ListWorkersPage(
    const v1::ListWorkersRequest& request) const {
  ASSIGN_OR_RETURN(PageRequest page, ParsePageRequest("workers", request.page_size(),
                                                      request.page_token(), 1000, 10000));
  v1::ListWorkersResponse response;
  bool more = false;
  {
    SectionLock lock(this, LockSection::kRead);
    for (v1::WorkerInfo& info : ListWorkersLocked(page.after, page.limit, &more)) {
      *response.add_workers() = std::move(info);
    }
  }
  if (more && response.workers_size() > 0) {
    response.set_next_page_token(
        PageToken("workers", response.workers(response.workers_size() - 1).worker_id()));
  }
  return response;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobsPage(
    const v1::ListJobsRequest& request) const {
  ASSIGN_OR_RETURN(PageRequest page, ParsePageRequest("jobs", request.page_size(),
                                                      request.page_token(), 100, 1000));
  int64_t after = 0;
  if (!page.after.empty() && (!absl::SimpleAtoi(page.after, &after) || after < 0)) {
    return absl::InvalidArgumentError(
        "page_token: not a next_page_token this coordinator returned for jobs");
  }
  v1::ListJobsResponse response;
  bool more = false;
  int64_t last = after;
  {
    SectionLock lock(this, LockSection::kRead);
    for (v1::Job& job : jobs_.ListPage(request.include_finished(), after, page.limit, &more,
                                       &last)) {
      *response.add_jobs() = std::move(job);
    }
  }
  if (more) response.set_next_page_token(PageToken("jobs", absl::StrCat(last)));
  return response;
}

std::vector<v1::WorkerInfo> Coordinator::ListWorkersLocked(const std::string& after, size_t limit,
                                                           bool* more) const {
  const absl::Time now = clock_->Now();
  std::vector<v1::WorkerInfo> out;
  *more = false;
  // Each job's mesh is read once per call, not once per member.
  absl::flat_hash_map<std::string, v1::MeshCoordinates> coordinates;
  absl::flat_hash_set<JobId> jobs_seen;
  for (const WorkerRecord* record : membership_.List()) {
    if (!after.empty() && record->id.value() <= after) continue;
    if (out.size() == limit) {
      *more = true;
      break;
    }
    v1::WorkerInfo info;
    info.set_worker_id(record->id.value());
    info.set_incarnation(record->incarnation.value());
    info.set_host(record->host);
    info.set_device_kind(record->device_kind);
    info.set_device_index(record->device_index);
    info.set_state(ToProtoState(record->state));
    if (record->job.has_value()) {
      info.set_job_id(record->job->value());
      if (jobs_seen.insert(*record->job).second) {
        absl::StatusOr<v1::Job> job = jobs_.Get(*record->job);
        if (job.ok()) {
          for (const auto& member : job->mesh().members()) {
            coordinates[member.worker_id()] = member.coordinates();
          }
        }
      }
      auto it = coordinates.find(record->id.value());
      if (it != coordinates.end()) *info.mutable_coordinates() = it->second;
    }
    info.set_metrics_address(record->metrics_address);
    info.set_last_heartbeat_age_ms(absl::ToInt64Milliseconds(now - record->last_heartbeat));
    *info.mutable_capabilities() = record->capabilities;
    if (record->warm.state() != v1::WARM_SPARE_STATE_UNSPECIFIED) {
      *info.mutable_warm() = record->warm;
    }
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<v1::WorkerInfo> Coordinator::DrainWorker(const WorkerId& worker,
                                                        const std::string& reason) {
  if (worker.value().empty()) return absl::InvalidArgumentError("worker_id: must not be empty");
  const std::string why = reason.empty() ? "drained by an operator" : reason;
  absl::Status drained = WithEffects([&](Effects* effects) -> absl::Status {
    const WorkerRecord* record = membership_.Find(worker);
    if (record == nullptr) {
      return absl::NotFoundError(absl::StrCat("worker ", worker.value(), " is not attached"));
    }
    if (record->state == WorkerState::kDraining) return absl::OkStatus();  // already on its way
    RETURN_IF_ERROR(membership_.MarkDraining(worker));
    LOG(INFO) << "draining worker " << worker << ": " << why;
    if (record->job.has_value()) {
      // It leaves once its job no longer needs it (ApplyMesh / DONATED).
      jobs_.OnWorkerDraining(worker, why, clock_->Now(), effects);
    } else {
      effects->messages.push_back(
          Effects::Message{worker, record->incarnation, commands::Drain(why)});
    }
    return absl::OkStatus();
  });
  RETURN_IF_ERROR(drained);
  for (v1::WorkerInfo& info : ListWorkers()) {
    if (info.worker_id() == worker.value()) return info;
  }
  return absl::NotFoundError(absl::StrCat("worker ", worker.value(), " left while draining"));
}

absl::StatusOr<v1::Job> Coordinator::Submit(const v1::SubmitJobRequest& request) {
  const v1::CheckpointPolicy& policy = request.spec().checkpoint();
  // Every error at once: the spec's own, and whether the checkpoint to
  // resume from exists (checked only for a well-formed job id, which the
  // validator reports otherwise).
  const absl::Status spec_errors = NormalizeJobSpec(request.spec()).status();
  const bool resume_malformed = absl::StrContains(spec_errors.message(), "checkpoint.resume_from_job");
  if (!policy.resume_from_job().empty() && !resume_malformed && options_.checkpoint_exists) {
    // Outside the lock: the check reads the checkpoint store.
    const std::optional<Step> step =
        policy.resume_from_step() > 0 ? std::optional<Step>(Step(policy.resume_from_step()))
                                      : std::nullopt;
    if (absl::Status found = options_.checkpoint_exists(JobId(policy.resume_from_job()), step);
        !found.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid job spec: ",
                       spec_errors.ok() ? "" : absl::StrCat(spec_errors.message(), "; "),
                       "checkpoint.resume_from_job: ", found.message()));
    }
  }
  ASSIGN_OR_RETURN(v1::Job job, JobManager::NewJob(request.spec(), clock_->Now()));
  if (request.validate_only()) return job;
  // The number and the first record are written before the job exists in
  // memory, without the lock: a failed write creates nothing, and nobody
  // waits on the disk for it but this caller.
  ASSIGN_OR_RETURN(int64_t number, store_->NextJobNumber());
  job.set_job_id(JobManager::NamedJobId(job.spec(), number));
  RETURN_IF_ERROR(store_->Put(job));
  return WithEffects([&](Effects* effects) {
    return jobs_.Admit(std::move(job), number, clock_->Now(), effects);
  });
}

absl::Status Coordinator::DeleteJob(const JobId& id) {
  if (id.value().empty()) return absl::InvalidArgumentError("job_id: must not be empty");
  Deliveries deliveries;
  {
    SectionLock lock(this, LockSection::kJobs);
    RETURN_IF_ERROR(jobs_.Delete(id));
    Collect(Effects(), &deliveries);
  }
  if (absl::Status flushed = deliveries.Run(); !flushed.ok()) {
    return absl::UnavailableError(
        absl::StrCat("job ", id.value(), " is deleted, but removing its record did not reach "
                     "the disk yet (retried with the next change): ", flushed.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const JobId& id) const {
  SectionLock lock(this, LockSection::kRead);
  return jobs_.Get(id);
}

absl::StatusOr<v1::LossHistory> Coordinator::GetLossHistory(const JobId& id) const {
  SectionLock lock(this, LockSection::kRead);
  return jobs_.LossHistory(id);
}

std::vector<v1::Job> Coordinator::ListJobs(bool include_finished) const {
  SectionLock lock(this, LockSection::kRead);
  return jobs_.List(include_finished);
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const JobId& id) {
  return WithEffects([&](Effects* effects) { return jobs_.Cancel(id, clock_->Now(), effects); });
}

absl::StatusOr<v1::Job> Coordinator::Scale(const v1::ScaleJobRequest& request) {
  return WithEffects([&](Effects* effects) {
    return jobs_.Scale(JobId(request.job_id()), request.min_workers(), request.max_workers(),
                       clock_->Now(), effects);
  });
}

absl::StatusOr<uint64_t> Coordinator::Watch(const JobId& id, std::shared_ptr<JobEventSink> sink) {
  v1::JobEvent snapshot;
  bool finished = false;
  uint64_t handle = 0;
  {
    SectionLock lock(this, LockSection::kJobs);
    ASSIGN_OR_RETURN(v1::Job job, jobs_.Get(id));
    snapshot.set_kind(v1::JOB_EVENT_KIND_SNAPSHOT);
    *snapshot.mutable_time() = ToProtoTime(clock_->Now());
    finished = job.state() == v1::JOB_STATE_COMPLETED || job.state() == v1::JOB_STATE_FAILED ||
               job.state() == v1::JOB_STATE_CANCELLED;
    *snapshot.mutable_job() = std::move(job);
    handle = next_watch_handle_++;
    // Registered under the lock with the snapshot, so no change slips between them.
    if (!finished) watchers_[handle] = Watcher{id, sink};
    sink->OnEvent(snapshot);
  }
  if (finished) sink->OnFinished();
  return handle;
}

void Coordinator::Unwatch(uint64_t handle) {
  SectionLock lock(this, LockSection::kJobs);
  watchers_.erase(handle);
}

void Coordinator::OnCheckpointFailed(const JobId& job, v1::CheckpointFailure failure) {
  metrics_->CheckpointFailed(failure.kind());
  WithEffects([&](Effects* effects) {
    jobs_.OnCheckpointFailed(job, std::move(failure), effects);
    return 0;
  });
}

void Coordinator::OnCheckpointCommitted(const JobId& job, const v1::CheckpointCommit& commit) {
  WithEffects([&](Effects* effects) {
    jobs_.OnCheckpointCommitted(job, commit, effects);
    return 0;
  });
}

absl::Status Coordinator::CheckKvScope(const KvScope& scope) const {
  ASSIGN_OR_RETURN(Generation current, jobs_.CurrentGeneration(scope.job));
  if (scope.generation < current) {
    return absl::AbortedError(absl::StrCat("generation ", scope.generation.value(), " of job ",
                                           scope.job.value(), " is stale: current generation is ",
                                           current.value()));
  }
  if (scope.generation > current) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", scope.generation.value(), " of job ", scope.job.value(),
                     " does not exist yet: current generation is ", current.value()));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CheckParticipant(const WorkerIdentity& caller, const JobId& job,
                                          Generation generation) const {
  if (caller.any()) return absl::OkStatus();
  SectionLock lock(this, LockSection::kRead);
  // Read in place: KeyValue calls come from every participant at bootstrap,
  // and a copy would carry the whole mesh each time.
  const v1::Job* found = jobs_.Find(job);
  if (found == nullptr || found->generation() != generation.value()) return absl::OkStatus();
  for (const v1::MeshMember& member : found->mesh().members()) {
    if (caller.AllowsWorker(member.worker_id(), member.host())) return absl::OkStatus();
  }
  for (const v1::Donor& donor : found->recovery().donors()) {
    const WorkerRecord* record = membership_.Find(WorkerId(donor.worker_id()));
    if (caller.AllowsWorker(donor.worker_id(), record != nullptr ? record->host : "")) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "this client certificate may act as ", caller.Describe(),
      ", none of which is a member or donor of job ", job.value(), " generation ",
      generation.value()));
}

absl::Status Coordinator::KvSet(const KvScope& scope, const std::string& key, std::string value) {
  Deliveries deliveries;
  {
    SectionLock lock(this, LockSection::kKeyValue);
    metrics_->KvOperation("set");
    // Limits first: they are about the request itself, whatever the scope.
    RETURN_IF_ERROR(kv_.CheckLimits(scope, key, value));
    RETURN_IF_ERROR(CheckKvScope(scope));
    ASSIGN_OR_RETURN(deliveries.kv, kv_.Set(scope, key, std::move(value)));
  }
  deliveries.Run().IgnoreError();  // logged; the writes stay queued
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::KvGet(const KvScope& scope, const std::string& key) {
  SectionLock lock(this, LockSection::kKeyValue);
  metrics_->KvOperation("get");
  RETURN_IF_ERROR(CheckKvScope(scope));
  return kv_.Get(scope, key);
}

uint64_t Coordinator::KvWaitFor(const KvScope& scope, const std::string& key,
                                absl::Duration timeout, KvWaiterCallback done) {
  Deliveries deliveries;
  uint64_t id = 0;
  {
    SectionLock lock(this, LockSection::kKeyValue);
    metrics_->KvOperation("wait");
    absl::Status valid = CheckKvScope(scope);
    if (!valid.ok()) {
      deliveries.kv.push_back(KvCompletion{std::move(done), valid});
    } else {
      if (timeout <= absl::ZeroDuration() || timeout > options_.max_kv_wait) {
        timeout = options_.max_kv_wait;
      }
      deliveries.kv = kv_.WaitFor(scope, key, clock_->Now() + timeout, std::move(done), &id);
    }
  }
  LOG(DEBUG) << "kv wait " << ScopeString(scope) << "/" << key;
  deliveries.Run().IgnoreError();  // logged; the writes stay queued
  return id;
}

void Coordinator::KvCancelWait(const KvScope& scope, const std::string& key, uint64_t id) {
  Deliveries deliveries;
  {
    SectionLock lock(this, LockSection::kKeyValue);
    deliveries.kv = kv_.CancelWaiter(scope, key, id);
  }
  deliveries.Run().IgnoreError();  // logged; the writes stay queued
}

}  // namespace cohort::coordinator
