#pragma once
// JobTable: the coordinator's jobs and their records. It owns every JobEntry,
// the indexes the other job classes walk (submit order for listing, the
// active jobs by number for scheduling, finished jobs by finish time for the
// retention, state counts and validated jobs for the gauges), the workers
// awaited for re-adoption, and the persistence of each record through the
// injected JobStore.
//
// Contract: an entry lives from Add (or Load) until Delete; references to
// it stay valid until then (std::map). Every change of a record that must
// survive a restart goes through SetState, SetMessage or Persist (written at
// once) or MarkBehind / HistoryChanged (written by the next WriteBehind); a
// write that fails leaves the entry dirty, retried by WriteBehind. Decisions
// about jobs (what to schedule, when to re-plan) are not made here.
//
// Pure logic with no clock of its own (times are passed in) and no I/O
// besides the JobStore. Not thread-safe: the Coordinator serialises calls.

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cohort/v1/jobs.pb.h"
#include "common/ids.h"
#include "coordinator/jobs/effects.h"
#include "coordinator/jobs/job_entry.h"
#include "coordinator/jobs/job_store.h"

namespace cohort::coordinator {

// How often at most a job's record is rewritten for new loss-history
// points alone (a coordinator restart loses at most this much of the curve).
inline constexpr absl::Duration kHistoryPersistInterval = absl::Seconds(10);
// Validation results a Job's progress shows (Progress.validation).
inline constexpr int kRecentValidationsShown = 8;

class JobTable {
 public:
  struct Options {
    // Workers of a job that could not reach each other are kept apart this
    // long (each entry's Reachability).
    absl::Duration partition_hold = absl::Seconds(30);
  };
  // `store` must outlive the table.
  JobTable(Options options, JobStore* store) : options_(options), store_(store) {}

  // Loads every stored record (after a coordinator restart) in creation
  // order, normalises specs and meshes written before today's fields, and
  // indexes them. Returns the unfinished jobs in that order; the caller
  // decides how to await their members.
  absl::StatusOr<std::vector<JobId>> Load();
  // A new job whose record is already stored: its entry, numbered `number`.
  JobEntry& Add(v1::Job job, int64_t number);
  // Removes a finished job's record, here and in the store. NotFound,
  // FailedPrecondition for a job that has not finished.
  absl::Status Delete(const JobId& id);

  // Null if unknown.
  JobEntry* Find(const JobId& id);
  const JobEntry* Find(const JobId& id) const;
  // A job known to exist.
  JobEntry& At(const JobId& id) { return jobs_.at(id); }
  const JobEntry& At(const JobId& id) const { return jobs_.at(id); }
  size_t size() const { return jobs_.size(); }
  // Every entry, finished ones too, in job id order.
  void ForEach(absl::FunctionRef<void(JobEntry&)> visit) {
    for (auto& [id, entry] : jobs_) visit(entry);
  }

  // Up to `limit` jobs in submit order after submit number `after` (0: from
  // the first); `*more` says whether any follow, `*last` the last number.
  std::vector<v1::Job> ListPage(bool include_finished, int64_t after, size_t limit, bool* more,
                                int64_t* last) const;
  // The unfinished jobs by number (submit order).
  const std::map<int64_t, JobId>& active() const { return active_; }
  // active()'s jobs, copied: a pass may finish one as it goes.
  std::vector<JobId> ActiveJobs() const;
  // `entry`'s job finished at `now`: it leaves the active jobs and the
  // retention counts from `now`.
  void MarkFinished(JobEntry& entry, absl::Time now);
  // Deletes finished jobs older than `retention` (zero: none), oldest first,
  // at most 64 per call; one that cannot be deleted is tried a minute later.
  void DeleteExpired(absl::Time now, absl::Duration retention);

  // Workers awaited for re-adoption (after a restart, or a stream taken
  // over by the same process): worker -> job and deadline.
  absl::flat_hash_map<WorkerId, Awaited>& awaiting() { return awaiting_; }
  const absl::flat_hash_map<WorkerId, Awaited>& awaiting() const { return awaiting_; }

  // --- Records ---

  // Changes the state (and message), persists, publishes STATE_CHANGED.
  void SetState(JobEntry& entry, v1::JobState state, const std::string& message, absl::Time now,
                Effects* effects);
  // Changes the message and persists (nothing if it is the same).
  void SetMessage(JobEntry& entry, const std::string& message, absl::Time now);
  // Writes the record with its loss history; a failure leaves it dirty.
  void Persist(JobEntry& entry);
  // `entry`'s record changed in what only informs (its checkpoint status):
  // the next WriteBehind writes it.
  void MarkBehind(JobEntry& entry);
  // Points were added to `entry`'s loss history: its record is behind.
  void HistoryChanged(JobEntry& entry);
  // Writes records left dirty by a failed write, and loss histories behind
  // by kHistoryPersistInterval.
  void WriteBehind(absl::Time now);
  // A snapshot of the job after a change, for its watchers.
  static void Emit(const JobEntry& entry, v1::JobEventKind kind, Effects* effects);

  // Adds the validations in `progress` that the history lacks; true if any.
  // The job's progress shows them once the caller calls ShowValidations.
  bool RecordValidations(JobEntry& entry, const v1::Progress& progress);
  // Copies the newest validations of the history into the job's progress.
  static void ShowValidations(JobEntry& entry);

  // Counts by state, for metrics (kept as jobs change: no walk).
  std::map<v1::JobState, int> CountByState() const { return state_counts_; }
  // The newest validation loss of every job that has one, by job id.
  std::map<std::string, double> LatestValidationLosses() const;

 private:
  // The entry of `id`, made with the table's options.
  JobEntry& NewEntry(const JobId& id);
  void CountState(v1::JobState state, int delta);
  // After `entry`'s dirty flags changed.
  void TrackUnpersisted(const JobEntry& entry);

  Options options_;
  JobStore* store_;
  std::map<JobId, JobEntry> jobs_;
  std::vector<JobId> order_;  // submit order, finished jobs too (listing)
  // The jobs not finished, by number (submit order): what scheduling,
  // timeouts and warm spares look at, so that their passes cost what runs,
  // not the week of finished jobs kept for listing (--finished_retention).
  std::map<int64_t, JobId> active_;
  // Finished jobs by when they finished (JobEntry::finished_at), for the
  // retention: DeleteExpired looks at the oldest only.
  std::set<std::pair<absl::Time, JobId>> finished_;
  // Kept as jobs come, change state and go: the gauges refresh on every
  // tick, and walking every job kept (a week of finished ones) there, under
  // the coordinator's lock, cost what the kept jobs cost, not what changed.
  std::map<v1::JobState, int> state_counts_;  // no zero counts
  std::set<JobId> validated_;                 // jobs with a validation loss
  // Jobs whose stored record is behind (JobEntry::dirty or history_dirty):
  // what WriteBehind writes.
  std::set<JobId> unpersisted_;
  absl::flat_hash_map<WorkerId, Awaited> awaiting_;
};

}  // namespace cohort::coordinator
