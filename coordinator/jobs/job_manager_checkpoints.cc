// JobManager: what the job's record says about its checkpoints
// (Job.checkpoint_status). CheckpointUploads decides what failed and what
// committed; this keeps the newest of each and the count of failures, so
// that `cohortctl get` shows a job whose checkpoints have stopped
// committing (issue 43: a full disk was only in the coordinator's log).

#include <utility>

#include "common/proto_time.h"
#include "common/safe_text.h"
#include "coordinator/jobs/job_manager.h"

namespace cohort::coordinator {

void JobManager::OnCheckpointFailed(const JobId& job, v1::CheckpointFailure failure,
                                    Effects* effects) {
  JobEntry* entry = table_.Find(job);
  if (entry == nullptr) return;  // deleted meanwhile
  // A store's message may name files of any bytes and run long; the record
  // is in every Job reply and printed by cohortctl.
  failure.set_reason(LogSafe(failure.reason(), kCheckpointReasonBytes));
  v1::CheckpointStatus* status = entry->job.mutable_checkpoint_status();
  status->set_failed_attempts(status->failed_attempts() + 1);
  // Reports of two writers' threads may arrive out of order: keep the newest.
  if (!status->has_last_failure() ||
      FromProtoTime(failure.time()) >= FromProtoTime(status->last_failure().time())) {
    *status->mutable_last_failure() = std::move(failure);
  }
  table_.MarkBehind(*entry);
  JobTable::Emit(*entry, v1::JOB_EVENT_KIND_CHECKPOINT, effects);
}

void JobManager::OnCheckpointCommitted(const JobId& job, const v1::CheckpointCommit& commit,
                                       Effects* effects) {
  JobEntry* entry = table_.Find(job);
  if (entry == nullptr) return;
  v1::CheckpointStatus* status = entry->job.mutable_checkpoint_status();
  if (status->has_last_commit()) {
    const v1::CheckpointCommit& last = status->last_commit();
    if (commit.step() < last.step() ||
        (commit.step() == last.step() &&
         FromProtoTime(commit.time()) < FromProtoTime(last.time()))) {
      return;  // an older step's report, after a newer one's
    }
  }
  *status->mutable_last_commit() = commit;
  table_.MarkBehind(*entry);
  JobTable::Emit(*entry, v1::JOB_EVENT_KIND_CHECKPOINT, effects);
}

}  // namespace cohort::coordinator
