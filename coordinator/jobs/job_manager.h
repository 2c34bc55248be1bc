#pragma once
// JobManager: the job state machine, scheduling of workers onto jobs, and
// re-planning on membership changes. Pure logic: inputs plus `now`, results
// returned as Effects (messages to send, events to publish); no I/O besides
// the injected JobStore, no threads. Not thread-safe (the Coordinator
// serialises calls).
//
// Where it lives: job_manager.cc (the state machine, scheduling, timeouts),
// job_manager_replan.cc (suspend, plan, rejoin), job_manager_warm.cc (warm
// spares), job_manager_checkpoints.cc (Job.checkpoint_status),
// stall_detector.h (when a running generation counts as stalled),
// worker_commands.h (every command sent to workers).
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
#include "coordinator/jobs/job_store.h"
#include "coordinator/jobs/mesh_planner.h"
#include "coordinator/jobs/recovery_planner.h"
#include "coordinator/membership/membership_table.h"
#include "coordinator/membership/reachability.h"
#include "coordinator/membership/stall_detector.h"

namespace cohort::coordinator {

// What a JobManager call wants done, in order.
struct Effects {
  struct Message {
    Message(WorkerId worker, Incarnation incarnation, v1::CoordinatorMessage message,
            std::shared_ptr<const v1::CoordinatorMessage> base = nullptr)
        : worker(std::move(worker)),
          incarnation(incarnation),
          message(std::move(message)),
          base(std::move(base)) {}
    WorkerId worker;
    Incarnation incarnation;
    v1::CoordinatorMessage message;
    // When set, what the worker gets is *base with `message` merged into it:
    // a command to many workers shares its large common part (spec, mesh,
    // plan), and the per-worker copy is made only after the coordinator's
    // lock is released (a 1,000-worker Assign held the lock for a second).
    std::shared_ptr<const v1::CoordinatorMessage> base;
    v1::CoordinatorMessage Full() const { return base ? WithBase(*base, message) : message; }
    // `base` with `message` merged into it.
    static v1::CoordinatorMessage WithBase(const v1::CoordinatorMessage& base,
                                           const v1::CoordinatorMessage& message);
  };
  struct Event {
    v1::JobEventKind kind;
    v1::Job job;  // snapshot after the change
  };
  struct GenerationChange {
    JobId job;
    Generation generation;  // the new current generation
  };
  std::vector<Message> messages;
  std::vector<Event> events;
  std::vector<GenerationChange> generation_changes;
  // Jobs that reached a terminal state (their KV scopes can be dropped).
  std::vector<JobId> finished_jobs;
  // Members the manager itself declared lost (not back within the restart
  // grace, back as a different process, silent when suspended, stalled),
  // for failure metrics and logs.
  std::vector<LostWorker> lost;
  // Recoveries completed (a re-planned generation became RUNNING).
  struct Recovery {
    JobId job;
    v1::RecoveryKind kind = v1::RECOVERY_KIND_UNSPECIFIED;
    bool spare = false;
    int64_t lost_steps = 0;
    absl::Duration detect_to_running;
  };
  std::vector<Recovery> recoveries;
  // Phases of recoveries (RecoveryStats): "suspend", "prepare", "first_step".
  struct RecoveryPhase {
    JobId job;
    const char* phase;
    absl::Duration took;
  };
  std::vector<RecoveryPhase> recovery_phases;
};

// How often at most a job's record is rewritten for new loss-history
// points alone (a coordinator restart loses at most this much of the curve).
inline constexpr absl::Duration kHistoryPersistInterval = absl::Seconds(10);
// Validation results a Job's progress shows (Progress.validation).
inline constexpr int kRecentValidationsShown = 8;
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
    awaiting_[worker] = Awaited{job, now};
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
  size_t awaiting_readoption() const { return awaiting_.size(); }

 private:
  // Phase 1 of a re-plan (see the class comment).
  struct Suspension {
    std::string reason;
    absl::Time started;   // when the change was noticed
    absl::Time deadline;  // for the answers
    absl::flat_hash_set<WorkerId> awaiting;
    // Survivors holding state in the live state's layout: worker -> step.
    std::map<std::string, int64_t> holders;
    bool growth = false;  // nobody was lost: a growth or a scale
    std::optional<absl::Time> waiting_since;  // no mesh possible yet
    // The plan would give up state while lost holders may still come back:
    // planning waits for them until this time.
    std::optional<absl::Time> rejoin_deadline;
    // Members that were lost and came back during this suspension.
    absl::flat_hash_set<WorkerId> rejoined;
    // From SUSPENDED statuses: workers that could not reach each other,
    // with the incarnations they had when reported; cuts once the suspension
    // completes with both still those processes and alive (a peer killed, or
    // restarted under its name, meanwhile is no cut).
    struct Unreachable {
      WorkerId reporter;
      Incarnation reporter_incarnation;
      WorkerId peer;
      Incarnation peer_incarnation;
    };
    std::vector<Unreachable> unreachable;
  };
  // A member lost while its process may still be alive (broken stream,
  // heartbeat timeout) holding the job's live state.
  struct Returning {
    Incarnation incarnation;
    v1::MeshMember member;  // its place in the mesh it left
    absl::Time deadline;    // awaited until then
  };
  struct JobEntry {
    v1::Job job;
    int64_t number = 0;  // submit order
    // Members that reported READY / COMPLETED for the current generation.
    absl::flat_hash_set<WorkerId> ready;
    absl::flat_hash_set<WorkerId> completed;
    bool dirty = false;  // persisted copy is stale (a Put failed)
    // The loss curve, persisted inside the job's record (Job.loss_history)
    // but kept out of `job`, which every API response copies.
    v1::LossHistory history;
    // Points added since the record was last written; written with the
    // next change or by Tick once kHistoryPersistInterval has passed.
    bool history_dirty = false;
    absl::Time history_persisted = absl::InfinitePast();
    std::optional<Suspension> suspension;
    Reachability reachability;  // pairs kept apart (partial partitions)
    // Lost members that may come back with the live state (see Returning),
    // until a later generation takes effect.
    absl::flat_hash_map<std::string, Returning> returning;
    // Donors of the current generation, released when they report DONATED;
    // a re-plan before then asks them to suspend with the members.
    absl::flat_hash_set<WorkerId> donors;
    // Every member of the current generation must be READY by then.
    std::optional<absl::Time> prepare_deadline;
    // The current generation's re-plan began at this time (for its
    // detect-to-running time), and whether it replaced a worker by a spare.
    std::optional<absl::Time> recovery_started;
    bool recovery_spare = false;
    // When that re-plan installed the current generation.
    std::optional<absl::Time> recovery_planned;
    // A recovery that took effect, until its generation completes a step.
    struct FirstStepWait {
      absl::Time started;  // detection
      absl::Time running;  // every member READY
      int64_t from_step = 0;
    };
    std::optional<FirstStepWait> first_step_wait;
    // The current generation's slowest member build and restore, from READY.
    v1::PreparePhases slowest_prepare;
    // Its members that reported READY with their training session kept, and
    // with one prepared ahead as warm spares.
    int sessions_kept = 0;
    int sessions_warm = 0;
    int models_kept = 0;  // and with a new session around their model shard
    // Heartbeat progress of the running generation's members.
    StallDetector stall;
    // The newest step any member reported completing since the last
    // recovery took effect (every member READY; from its step), for the
    // lost steps of the next plan. A plan that never took effect is not
    // counted, so the next one counts its steps again.
    int64_t reached_step = 0;
    // When the job finished (its key in finished_); unset while it runs.
    std::optional<absl::Time> finished_at;
  };
  struct Awaited {
    JobId job;
    absl::Time deadline;
  };

  JobEntry* FindEntry(const JobId& id);
  const JobEntry* FindEntry(const JobId& id) const;
  // The entry of `id`, made with the manager's options.
  JobEntry& NewEntry(const JobId& id);
  static bool IsTerminal(v1::JobState state);
  // A mesh that lost members and could not yet be re-planned.
  static bool MeshIncomplete(const v1::Mesh& mesh);
  bool IsMember(const JobEntry& entry, const WorkerId& worker) const;

  // " (no GPU worker is attached)" when no worker of `kind` is attached
  // (a waiting job's message says so); empty otherwise.
  std::string NoneAttached(v1::DeviceKind kind) const;
  // Options::latest_checkpoint's answer, when it is set.
  std::optional<int64_t> LatestCheckpoint(const JobId& id) const;
  static PlannerWorker ToPlannerWorker(const WorkerRecord& record);
  static PlanRequest MakePlanRequest(const v1::JobSpec& spec);

  // --- job_manager.cc: the state machine and scheduling ---

  // Tries to start pending jobs and grow running ones.
  void Schedule(absl::Time now, Effects* effects);
  // Adds idle workers of the spec's device kind to request->candidates,
  // whole hosts at a time, as many as the job could use (AppendIdleCandidates).
  void AppendIdleCandidates(const v1::JobSpec& spec, PlanRequest* request) const;
  // Fences silent suspended members and stalled ones; fails jobs that waited
  // too long for workers.
  void CheckTimeouts(JobEntry& entry, absl::Time now, Effects* effects);
  // Turns the suspension's unreachable reports whose two workers are both
  // alive into cuts, then drops from `request` the candidates a cut-free
  // plan leaves out (preferring `holders`); returns them.
  std::vector<std::string> KeepReachable(JobEntry& entry, PlanRequest* request,
                                         const std::map<std::string, int64_t>& holders,
                                         absl::Time now);
  // Stops all members and moves the job to a terminal state.
  void Finish(JobEntry& entry, v1::JobState state, const std::string& message, absl::Time now,
              Effects* effects);
  // Drops a member from the job's mesh and membership.
  void RemoveMember(JobEntry& entry, const WorkerId& worker);

  // --- job_manager_replan.cc: suspend, plan, rejoin ---

  // Re-plans an active job over its remaining members plus idle workers:
  // starts (or joins) a suspension when members remain, else plans at once.
  // `only_if_larger` restricts it to growth.
  void Replan(JobEntry& entry, const std::string& reason, bool only_if_larger, absl::Time now,
              Effects* effects);
  // Phase 1: asks every remaining member to suspend, except `answered` (a
  // member whose unasked SUSPENDED starts the phase: a second Suspend could
  // reach it after the next generation's command and interrupt it).
  void BeginSuspension(JobEntry& entry, const std::string& reason, bool growth, absl::Time now,
                       Effects* effects, const std::string& answered = "");
  // Phase 2, once every member answered: plans and applies the next mesh,
  // or waits for workers.
  void CompleteSuspension(JobEntry& entry, absl::Time now, Effects* effects);
  // Records a SUSPENDED answer.
  void OnSuspended(JobEntry& entry, const WorkerId& worker, const v1::AssignmentStatus& status,
                   absl::Time now, Effects* effects);
  // Installs `mesh` as the next generation and tells every worker involved.
  void ApplyMesh(JobEntry& entry, v1::Mesh mesh, const std::string& reason,
                 const v1::RecoveryPlan& plan, absl::Time now, Effects* effects);
  // Adds a member back during a suspension: it is awaited (due by
  // suspend_timeout from now at the latest) and sent Suspend.
  void AskToSuspend(JobEntry& entry, const WorkerId& worker, Incarnation incarnation,
                    absl::Time now, Effects* effects);
  // A lost member of the live generation whose process may be alive is
  // remembered (JobEntry::returning) for the rejoin grace.
  void RememberReturning(JobEntry& entry, const LostWorker& lost, absl::Time now);
  // When the last member of a job running its live generation was lost and
  // every member may still be alive (a stall of the whole job), puts the
  // mesh back and awaits every member for the grace instead of re-planning;
  // true if it did.
  bool AwaitEveryMember(JobEntry& entry, const std::string& reason, absl::Time now,
                        Effects* effects);
  // A worker attached: takes it back into the suspension of a job it left
  // with that job's state (true), or forgets it where it came back as a new
  // process (its state is gone).
  bool Rejoin(const v1::Hello& hello, absl::Time now, Effects* effects);
  // How long lost holders are awaited before state is given up.
  absl::Duration RejoinGrace(const JobEntry& entry) const;

  // --- job_manager_warm.cc ---

  // Names idle workers warm spares of running jobs, in submit order, up to
  // warm_spares_per_job each (spares keep their job while it needs them),
  // and sends WarmUp to those whose place changed and a release to idle
  // workers that are no longer spares. Cheap enough to run after every
  // scheduling pass: jobs x spares, plus the idle lists.
  void UpdateWarmSpares(Effects* effects);

  // --- job_manager.cc: records, events, Stop ---

  void SetState(JobEntry& entry, v1::JobState state, const std::string& message, absl::Time now,
                Effects* effects);
  void SetMessage(JobEntry& entry, const std::string& message, absl::Time now);
  void Persist(JobEntry& entry);
  // Adds the validations in `progress` that the history lacks; true if any.
  // The job's progress shows them once the caller calls ShowValidations.
  bool RecordValidations(JobEntry& entry, const v1::Progress& progress);
  // Copies the newest validations of the history into the job's progress.
  void ShowValidations(JobEntry& entry);
  void Emit(const JobEntry& entry, v1::JobEventKind kind, Effects* effects) const;
  void SendStop(const WorkerId& worker, const JobId& job, Generation generation,
                const std::string& reason, Effects* effects) const;

  Options options_;
  MembershipTable* membership_;
  JobStore* store_;
  std::map<JobId, JobEntry> jobs_;
  std::vector<JobId> order_;  // submit order, finished jobs too (listing)
  // The jobs not finished, by number (submit order): what scheduling,
  // timeouts and warm spares look at, so that their passes cost what runs,
  // not the week of finished jobs kept for listing (--finished_retention).
  std::map<int64_t, JobId> active_;
  // active_'s jobs, copied: a pass may finish one as it goes.
  std::vector<JobId> ActiveJobs() const;
  // Finished jobs by when they finished (JobEntry::finished_at), for the
  // retention: Tick looks at the oldest only.
  std::set<std::pair<absl::Time, JobId>> finished_;
  // Kept as jobs come, change state and go: the gauges refresh on every
  // tick, and walking every job kept (a week of finished ones) there, under
  // the coordinator's lock, cost what the kept jobs cost, not what changed.
  std::map<v1::JobState, int> state_counts_;  // no zero counts
  std::set<JobId> validated_;  // jobs with a validation loss
  void CountState(v1::JobState state, int delta);
  // Jobs whose stored record is behind (JobEntry::dirty or history_dirty):
  // what Tick writes.
  std::set<JobId> unpersisted_;
  // After `entry`'s dirty flags changed.
  void TrackUnpersisted(const JobEntry& entry);
  // Points were added to `entry`'s loss history: its record is behind.
  void HistoryChanged(JobEntry& entry);
  // `entry`'s record changed in what only informs (its checkpoint status):
  // the next tick writes it.
  void MarkBehind(JobEntry& entry);
  absl::flat_hash_map<WorkerId, Awaited> awaiting_;
  // What each warm spare was last told to prepare.
  struct WarmTarget {
    Incarnation incarnation;
    JobId job;
    Generation generation;
    int rank = 0;
    bool operator==(const WarmTarget&) const = default;
  };
  absl::flat_hash_map<WorkerId, WarmTarget> warm_targets_;
  uint64_t warm_sequence_ = 0;  // WarmUp.sequence of the last one sent
};

}  // namespace cohort::coordinator
