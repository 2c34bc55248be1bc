#pragma once
// JobManager: the job state machine, and the one entry point for every event
// about jobs (submits, workers joining and lost, statuses, progress, ticks),
// which it routes to the parts that decide: scheduling of workers onto jobs
// and re-planning on membership changes. Pure logic: inputs plus `now`, results
// returned as Effects (messages to send, events to publish); no I/O besides
// the injected JobStore, no threads. Not thread-safe (the Coordinator
// serialises calls).
//
// Where it lives: JobManager is the thin owner that routes events to the
// classes that decide: JobTable (job_table.h: the jobs, their records and
// persistence, the workers awaited for re-adoption), Scheduler (scheduler.h:
// which waiting job gets which free workers), Replanner (replanner.h:
// suspend, plan, rejoin, the next generation), WarmSpares (warm_spares.h).
// What remains here: the job lifecycle (submit, cancel, scale, finish) and
// timeouts (job_manager.cc), worker attach and re-adoption
// (job_manager_joins.cc), each assignment state's handler
// (job_manager_status.cc), Job.checkpoint_status (job_manager_checkpoints.cc);
// stall_detector.h decides when a running generation counts as stalled and
// worker_commands.h builds every command sent to workers.
//
// Job states:
//
//   PENDING --(enough idle workers: first mesh, generation 1)--> RUNNING
//   RUNNING --(member lost / stalled / drained / worker joins below max /
//              scale)--> RECONFIGURING
//   RECONFIGURING --(every member READY for the new generation)--> RUNNING
//   any non-terminal --(Cancel)--> CANCELLED
//   RUNNING/RECONFIGURING --(all members COMPLETED)--> COMPLETED
//   RUNNING/RECONFIGURING --(a member reports FAILED)--> FAILED
//
// The generation is bumped on every mesh change and carried by every
// Assign/Reconfigure/Stop; statuses naming any other generation are refused
// (Aborted).
//
// Re-planning a job that has members is two-phase, so the new generation can
// take its state from the old one's memory (docs/architecture.md,
// "Elasticity"):
//
//   1. suspend: every remaining member gets Suspend(g) and answers SUSPENDED
//      with the states it holds (a member that detects a peer's failure
//      first may answer unasked, which starts the phase). Members silent for
//      suspend_timeout are treated as lost (hung).
//   2. plan: the mesh over the survivors plus idle workers (MeshPlanner),
//      and where the state comes from (PlanRecovery: the survivors' memory,
//      else the newest checkpoint); generation g+1 gets Reconfigure/Assign
//      with the plan, survivors left out that hold needed state get
//      Reconfigure as donors (released when they report DONATED), the rest
//      Stop.
//
// When the survivors plus idle workers cannot form a mesh of at least
// min_workers, the job stays RECONFIGURING (the survivors keep their state)
// with a message saying what it waits for, for elastic.wait_for_workers
// seconds; then it fails with that message.
//
// Scheduling is first-come-first-served with backfill: pending jobs take idle
// workers in submit order; a job that cannot start does not block later,
// smaller jobs. Running jobs below max_workers grow when idle workers appear.
//
// A member lost while its process may still be alive (its stream broke, its
// heartbeats stopped: a stall, a partition) is remembered for
// min(readopt_grace, elastic.wait_for_workers_seconds). When a re-plan would
// give up state (a checkpoint or a fresh start), planning waits for such
// members; one that re-attaches as the same process holding the job's
// generation rejoins the suspension (Suspend, then its held states), so the
// job recovers from memory. Starting over is the last resort.
//
// After a coordinator restart (Restore), members of RUNNING/RECONFIGURING
// jobs are awaited for `readopt_grace`: a worker re-attaching with the same
// incarnation, job, generation and coordinates is re-adopted without a
// re-plan (a re-adopted worker whose READY the old coordinator may not have
// recorded is sent its Reconfigure again, which it answers with its state);
// members still missing when the grace ends are treated as lost.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"
#include "coordinator/jobs/effects.h"
#include "coordinator/jobs/job_entry.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/jobs/replanner.h"
#include "coordinator/jobs/scheduler.h"
#include "coordinator/jobs/warm_spares.h"
#include "coordinator/membership/membership_table.h"

namespace cohort::coordinator {

// Bytes of a failed checkpoint attempt's reason kept in the job's record
// (CheckpointFailure.reason): a store's message names the data dir and a
// file, a few hundred bytes; more would only make every Job reply larger.
inline constexpr size_t kCheckpointReasonBytes = 512;

class JobManager {
 public:
  struct Options {
    absl::Duration readopt_grace = absl::Seconds(10);
    // How long suspended members may take to answer before they count as
    // lost (hung).
    absl::Duration suspend_timeout = absl::Seconds(10);
    // Stall detection: a RUNNING job whose members' steps have not advanced
    // for max(hang_timeout_floor, hang_step_multiple x its median step time)
    // fences its members that are not waiting for peers. Zero floor: off.
    absl::Duration hang_timeout_floor = absl::Seconds(30);
    double hang_step_multiple = 20.0;
    // A member lost to a broken stream is awaited this long at most (a live
    // process whose stream broke re-attaches within its reconnect backoff,
    // about a second while it holds an assignment; a killed one never does).
    // Heartbeat timeouts (stalls, partitions) get the whole readopt_grace.
    absl::Duration stream_rejoin_grace = absl::Seconds(3);
    // A new generation whose members have not all reported READY within
    // this time is re-planned (members stuck preparing are asked to suspend;
    // silent ones are fenced). The workers' own deadlines (bootstrap,
    // collectives, checkpoint loads) normally end a failed Prepare first.
    absl::Duration prepare_timeout = absl::Minutes(10);
    // The job's newest committed checkpoint step, for recovery plans; unset:
    // none known.
    std::function<std::optional<Step>(const JobId&)> latest_checkpoint;
    // A finished job (COMPLETED, FAILED, CANCELLED) is deleted this long
    // after it finished (its checkpoints stay). Zero: kept until deleted.
    absl::Duration finished_retention = absl::Hours(24 * 7);
    // Idle workers named warm spares of each running job (WarmUp): they
    // prepare the session of a place ahead. 0: none.
    int warm_spares_per_job = 1;
    // Workers of a job that could not reach each other (both alive) are
    // kept apart in its plans this long, doubling on repeats (Reachability).
    absl::Duration partition_hold = absl::Seconds(30);
  };
  // `membership` and `store` must outlive the manager.
  JobManager(Options options, MembershipTable* membership, JobStore* store);
  // Its parts point at each other.
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Loads persisted jobs (after a coordinator restart). Members of active
  // jobs are awaited until now + readopt_grace.
  absl::Status Restore(absl::Time now);

  // Validates the spec (NormalizeJobSpec) and creates a PENDING job, then
  // schedules. InvalidArgument for a bad spec; the JobStore's error if it
  // cannot be persisted (nothing is created then). With validate_only the
  // normalized job is returned and nothing is stored.
  // (NewJob, then the store's NextJobNumber and Put, then Admit.)
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, bool validate_only, absl::Time now,
                                 Effects* effects);
  // Submit in parts, so a caller can do the durable writes without holding
  // the lock the rest needs: the PENDING record of a spec (no id yet;
  // InvalidArgument for a bad spec) ...
  static absl::StatusOr<v1::Job> NewJob(const v1::JobSpec& spec, absl::Time now);
  // ... and, once it carries its id (NamedJobId) and is durably stored, its
  // admission: the job exists here and is scheduled.
  v1::Job Admit(v1::Job job, int64_t number, absl::Time now, Effects* effects);
  static std::string NamedJobId(const v1::JobSpec& spec, int64_t number);
  // NotFound for an unknown id.
  absl::StatusOr<v1::Job> Get(const JobId& id) const;
  // The job without a copy (null if unknown); valid until the next call
  // that changes jobs.
  const v1::Job* Find(const JobId& id) const;
  // Jobs in submit order; finished ones only if include_finished.
  // Up to `limit` jobs in submit order after submit number `after` (0:
  // from the first); `*more` says whether any follow.
  std::vector<v1::Job> ListPage(bool include_finished, int64_t after, size_t limit, bool* more,
                                int64_t* last) const;
  std::vector<v1::Job> List(bool include_finished) const;
  // Stops every member and marks the job CANCELLED. NotFound;
  // FailedPrecondition if the job already finished.
  absl::StatusOr<v1::Job> Cancel(const JobId& id, absl::Time now, Effects* effects);
  // Removes a finished job's record, here and in the store (its
  // checkpoints stay). NotFound, or FailedPrecondition for a job that has
  // not finished (cancel it first).
  absl::Status Delete(const JobId& id);
  // Changes the elastic bounds (validated like a spec) and re-plans if the
  // current mesh no longer fits them or can grow. NotFound, InvalidArgument,
  // FailedPrecondition (finished job).
  absl::StatusOr<v1::Job> Scale(const JobId& id, int min_workers, int max_workers, absl::Time now,
                                Effects* effects);

  // A worker attached (after MembershipTable::Join). Re-adopts it if it comes
  // back to the mesh it holds; tells it to drop an assignment nobody knows;
  // then schedules.
  void OnWorkerJoined(const v1::Hello& hello, absl::Time now, Effects* effects);
  // The next OnWorkerJoined of `worker` re-adopts it into `job` (a live
  // worker's stream taken over by the same process: JoinResult::readopt_into)
  // as after a coordinator restart, without counting it lost.
  void ExpectReadoption(const WorkerId& worker, const JobId& job, absl::Time now) {
    table_.awaiting()[worker] = Awaited{job, now};
  }
  // Workers were lost (stream broken, heartbeat timeout, replaced): each
  // affected job is re-planned once, over its survivors and idle workers.
  void OnWorkersLost(const std::vector<LostWorker>& lost, absl::Time now, Effects* effects);
  // Assignment status from a worker. Aborted if it names an older generation
  // (or a job the worker is not a member of); NotFound for an unknown job.
  absl::Status OnAssignmentStatus(const WorkerId& worker, const v1::AssignmentStatus& status,
                                  absl::Time now, Effects* effects);
  // Progress from a heartbeat (ignored unless job and generation are current).
  void OnProgress(const WorkerId& worker, const v1::Heartbeat& heartbeat, absl::Time now,
                  Effects* effects);
  // Takes `worker` out of its job (re-planned without it; it serves its
  // state as a donor first). The worker must already be marked DRAINING in
  // the membership table. No-op when it is in no job.
  void OnWorkerDraining(const WorkerId& worker, const std::string& reason, absl::Time now,
                        Effects* effects);
  // A checkpoint attempt of `job` failed (CheckpointUploads): it becomes the
  // job's checkpoint_status.last_failure (its reason bounded to
  // kCheckpointReasonBytes and made printable) unless a newer one is there,
  // failed_attempts counts it, and the record is persisted and published (a
  // CHECKPOINT event). An unknown job is ignored.
  void OnCheckpointFailed(const JobId& job, v1::CheckpointFailure failure, Effects* effects);
  // A checkpoint of `job` committed: it becomes checkpoint_status.last_commit
  // unless that is a newer step; persisted and published likewise. The
  // last failure stays (a reader compares the times). An unknown job is
  // ignored.
  void OnCheckpointCommitted(const JobId& job, const v1::CheckpointCommit& commit,
                             Effects* effects);
  // Ends re-adoption grace periods that have passed and retries failed
  // persistence.
  void Tick(absl::Time now, Effects* effects);

  // The coordinator itself did not run for `gap` (ending at `now`): every
  // deadline and timer it keeps (re-adoption and rejoin graces, suspension
  // and prepare deadlines, waits for workers, stall detection) moves later
  // by `gap`, so its own stall is not counted against the workers.
  void Discount(absl::Duration gap, absl::Time now);

  // The current generation of a non-terminal job; NotFound otherwise.
  absl::StatusOr<Generation> CurrentGeneration(const JobId& id) const;
  // Counts by state, for metrics.
  std::map<v1::JobState, int> CountByState() const;
  // The job's loss curve (loss_history.h); NotFound for an unknown job.
  absl::StatusOr<v1::LossHistory> LossHistory(const JobId& id) const;
  // The newest validation loss of every job that has one, by job id.
  std::map<std::string, double> LatestValidationLosses() const;
  // Workers still awaited after a restart.
  size_t awaiting_readoption() const { return table_.awaiting().size(); }

 private:
  // --- job_manager_joins.cc ---

  // Re-adopts `hello`'s worker if it was awaited (after a restart) and comes
  // back to its place, or takes it into a re-plan with the state it holds;
  // true if it did. Otherwise its old self counts as lost.
  bool Readopt(const v1::Hello& hello, absl::Time now, Effects* effects);

  // --- job_manager_status.cc: one handler per assignment state ---

  absl::Status OnDonated(JobEntry& entry, const WorkerId& worker,
                         const v1::AssignmentStatus& status, absl::Time now, Effects* effects);
  void OnReady(JobEntry& entry, const WorkerId& worker, const v1::AssignmentStatus& status,
               absl::Time now, Effects* effects);
  void OnCompleted(JobEntry& entry, const WorkerId& worker, const v1::AssignmentStatus& status,
                   absl::Time now, Effects* effects);
  void OnFailed(JobEntry& entry, const WorkerId& worker, const v1::AssignmentStatus& status,
                absl::Time now, Effects* effects);
  void OnReleased(JobEntry& entry, const WorkerId& worker, absl::Time now, Effects* effects);
  // Every member is READY: the generation holds the job's state now (its
  // live state), and a recovery that brought it there is counted.
  void TakeEffect(JobEntry& entry, absl::Time now, Effects* effects);
  // The recovery that just took effect: its stats, phases and Recovery.
  void RecordRecovery(JobEntry& entry, absl::Time now, Effects* effects);

  // --- job_manager.cc ---

  // Fences silent suspended members and stalled ones; fails jobs that waited
  // too long for workers.
  void CheckTimeouts(JobEntry& entry, absl::Time now, Effects* effects);
  // Marks `workers` lost as hung (for `why`) and re-plans their jobs.
  void Fence(const JobId& id, const std::vector<std::string>& workers, const std::string& why,
             absl::Time now, Effects* effects);
  // Stops all members and moves the job to a terminal state.
  void Finish(JobEntry& entry, v1::JobState state, const std::string& message, absl::Time now,
              Effects* effects);
  // Drops a member from the job's mesh and membership.
  void RemoveMember(JobEntry& entry, const WorkerId& worker);

  Options options_;
  MembershipTable* membership_;
  JobStore* store_;
  // Declared in the order they refer to each other.
  JobTable table_;
  WarmSpares warm_;
  Replanner replanner_;
  Scheduler scheduler_;
};

}  // namespace cohort::coordinator
