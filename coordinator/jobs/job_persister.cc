#include "coordinator/jobs/job_persister.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::coordinator {

uint64_t JobPersister::QueueLocked(JobWrite write) {
  const uint64_t ticket = ++last_ticket_;
  const std::string id = write.job_id;
  queued_[id] = Queued{std::move(write), ticket};
  return ticket;
}

absl::Status JobPersister::Put(const v1::Job& job) {
  if (job.job_id().empty()) return absl::InvalidArgumentError("job has no job_id");
  absl::MutexLock lock(&mu_);
  QueueLocked(JobWrite{job.job_id(), job});
  return absl::OkStatus();
}

absl::Status JobPersister::Delete(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: must not be empty");
  absl::MutexLock lock(&mu_);
  QueueLocked(JobWrite{job_id, std::nullopt});
  return absl::OkStatus();
}

absl::Status JobPersister::Write(const std::vector<JobWrite>& writes) {
  for (const JobWrite& write : writes) {
    if (write.job_id.empty()) return absl::InvalidArgumentError("a write has no job_id");
  }
  absl::MutexLock lock(&mu_);
  for (const JobWrite& write : writes) QueueLocked(write);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> JobPersister::LoadAll() { return durable_->LoadAll(); }

absl::StatusOr<int64_t> JobPersister::NextJobNumber() { return durable_->NextJobNumber(); }

uint64_t JobPersister::last_ticket() const {
  absl::MutexLock lock(&mu_);
  return last_ticket_;
}

bool JobPersister::has_queued() const {
  absl::MutexLock lock(&mu_);
  return !queued_.empty();
}

JobPersister::Counters JobPersister::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

absl::Status JobPersister::Flush(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (durable_ticket_ >= ticket) return absl::OkStatus();
    if (!writing_) break;
    // Another caller's batch is on its way; it may cover this ticket.
    mu_.Await(absl::Condition(
        +[](bool* writing) { return !*writing; }, &writing_));
  }
  // This caller writes everything queued so far, as one batch.
  writing_ = true;
  std::map<std::string, Queued> batch;
  batch.swap(queued_);
  const uint64_t through = last_ticket_;
  std::vector<JobWrite> writes;
  writes.reserve(batch.size());
  for (const auto& [id, queued] : batch) writes.push_back(queued.write);
  mu_.Unlock();
  const absl::Time start = absl::Now();
  const absl::Status written = durable_->Write(writes);
  if (written.ok() && on_batch_) on_batch_(static_cast<int64_t>(writes.size()), absl::Now() - start);
  mu_.Lock();
  writing_ = false;
  if (written.ok()) {
    // Everything queued up to `through` was in the batch (older records of
    // a job were replaced by the newer one it carried).
    durable_ticket_ = std::max(durable_ticket_, through);
    ++counters_.batches;
    counters_.records += writes.size();
    return absl::OkStatus();
  }
  ++counters_.failures;
  // Back in the queue, unless a newer record of the job arrived meanwhile.
  for (auto& [id, queued] : batch) queued_.try_emplace(id, std::move(queued));
  const absl::Status failed(written.code(),
                            absl::StrCat("job records not yet durable (queued, retried on the "
                                         "next change or tick): ",
                                         written.message()));
  // Retried every tick while the disk fails: logged every 10 s, not 20 times a second.
  const absl::Time now = absl::Now();
  if (now - last_failure_logged_ >= absl::Seconds(10)) {
    LOG(ERROR) << failed << " (" << counters_.failures - failures_logged_
               << " failed batches since the last report; " << queued_.size() << " queued)";
    last_failure_logged_ = now;
    failures_logged_ = counters_.failures;
  }
  return failed;
}

}  // namespace cohort::coordinator
