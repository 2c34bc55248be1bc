#include "coordinator/jobs/job_store.h"

#include "common/status_macros.h"

#include <utility>

namespace cohort::coordinator {

absl::Status JobStore::Write(const std::vector<JobWrite>& writes) {
  for (const JobWrite& write : writes) {
    RETURN_IF_ERROR(write.job.has_value() ? Put(*write.job) : Delete(write.job_id));
  }
  return absl::OkStatus();
}

absl::Status InMemoryJobStore::Write(const std::vector<JobWrite>& writes) {
  absl::MutexLock lock(&mu_);
  if (!next_put_status_.ok()) return std::exchange(next_put_status_, absl::OkStatus());
  for (const JobWrite& write : writes) {
    if (write.job_id.empty()) return absl::InvalidArgumentError("a write has no job_id");
  }
  for (const JobWrite& write : writes) {
    if (write.job.has_value()) {
      jobs_[write.job_id] = *write.job;
    } else {
      jobs_.erase(write.job_id);
    }
  }
  return absl::OkStatus();
}

absl::Status InMemoryJobStore::Put(const v1::Job& job) {
  absl::MutexLock lock(&mu_);
  if (!next_put_status_.ok()) {
    // One-shot: the injected failure applies to exactly one Put.
    return std::exchange(next_put_status_, absl::OkStatus());
  }
  if (job.job_id().empty()) return absl::InvalidArgumentError("job has no job_id");
  jobs_[job.job_id()] = job;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> InMemoryJobStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> jobs;
  jobs.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) jobs.push_back(job);
  return jobs;
}

absl::StatusOr<int64_t> InMemoryJobStore::NextJobNumber() {
  absl::MutexLock lock(&mu_);
  return next_number_++;
}

absl::Status InMemoryJobStore::Delete(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
  return absl::OkStatus();
}

void InMemoryJobStore::FailNextPut(absl::Status status) {
  absl::MutexLock lock(&mu_);
  next_put_status_ = std::move(status);
}

}  // namespace cohort::coordinator
