#pragma once
// JobManager: the job state machine, scheduling of workers onto jobs, and
// re-planning on membership changes. Pure logic: inputs plus `now`, results
// returned as Effects (messages to send, events to publish); no I/O besides
// the injected JobStore, no threads. Not thread-safe (the Coordinator
// serialises calls).
//
// Job states:
//
//   PENDING --(enough idle workers: first mesh, generation 1)--> RUNNING
//   RUNNING --(member lost / worker joins below max / scale)--> RECONFIGURING
//   RECONFIGURING --(every member READY for the new generation)--> RUNNING
//   any non-terminal --(Cancel)--> CANCELLED
//   RUNNING/RECONFIGURING --(all members COMPLETED)--> COMPLETED
//   RUNNING/RECONFIGURING --(a member reports FAILED)--> FAILED
//
// The generation is bumped on every mesh change and carried by every
// Assign/Reconfigure/Stop; statuses naming any other generation are refused
// (Aborted). When a job loses members and the survivors plus idle workers
// cannot form a mesh of at least min_workers, it stays RECONFIGURING with a
// message saying what it waits for; survivors stay reserved to it.
//
// Scheduling is first-come-first-served with backfill: pending jobs take idle
// workers in submit order; a job that cannot start does not block later,
// smaller jobs. Running jobs below max_workers grow when idle workers appear.
//
// After a coordinator restart (Restore), members of RUNNING/RECONFIGURING
// jobs are awaited for `readopt_grace`: a worker re-attaching with the same
// incarnation, job, generation and coordinates is re-adopted without a
// re-plan (a re-adopted worker whose READY the old coordinator may not have
// recorded is sent its Reconfigure again, which it answers with its state);
// members still missing when the grace ends are treated as lost.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"
#include "coordinator/job_store.h"
#include "coordinator/membership_table.h"

namespace cohort::coordinator {

// What a JobManager call wants done, in order.
struct Effects {
  struct Message {
    WorkerId worker;
    Incarnation incarnation;
    v1::CoordinatorMessage message;
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
  // grace, or back as a different process), for failure metrics and logs.
  std::vector<LostWorker> lost;
};

class JobManager {
 public:
  struct Options {
    absl::Duration readopt_grace = absl::Seconds(10);
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
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, bool validate_only, absl::Time now,
                                 Effects* effects);
  // NotFound for an unknown id.
  absl::StatusOr<v1::Job> Get(const JobId& id) const;
  // Jobs in submit order; finished ones only if include_finished.
  std::vector<v1::Job> List(bool include_finished) const;
  // Stops every member and marks the job CANCELLED. NotFound;
  // FailedPrecondition if the job already finished.
  absl::StatusOr<v1::Job> Cancel(const JobId& id, absl::Time now, Effects* effects);
  // Changes the elastic bounds (validated like a spec) and re-plans if the
  // current mesh no longer fits them or can grow. NotFound, InvalidArgument,
  // FailedPrecondition (finished job).
  absl::StatusOr<v1::Job> Scale(const JobId& id, int min_workers, int max_workers, absl::Time now,
                                Effects* effects);

  // A worker attached (after MembershipTable::Join). Re-adopts it if it comes
  // back to the mesh it holds; tells it to drop an assignment nobody knows;
  // then schedules.
  void OnWorkerJoined(const v1::Hello& hello, absl::Time now, Effects* effects);
  // Workers were lost (stream broken, heartbeat timeout, replaced): each
  // affected job is re-planned once, over its survivors and idle workers.
  void OnWorkersLost(const std::vector<LostWorker>& lost, absl::Time now, Effects* effects);
  // Assignment status from a worker. Aborted if it names an older generation
  // (or a job the worker is not a member of); NotFound for an unknown job.
  absl::Status OnAssignmentStatus(const WorkerId& worker, const v1::AssignmentStatus& status,
                                  absl::Time now, Effects* effects);
  // Progress from a heartbeat (ignored unless job and generation are current).
  void OnProgress(const WorkerId& worker, const v1::Heartbeat& heartbeat, Effects* effects);
  // Ends re-adoption grace periods that have passed and retries failed
  // persistence.
  void Tick(absl::Time now, Effects* effects);

  // The current generation of a non-terminal job; NotFound otherwise.
  absl::StatusOr<Generation> CurrentGeneration(const JobId& id) const;
  // Counts by state, for metrics.
  std::map<v1::JobState, int> CountByState() const;
  // Workers still awaited after a restart.
  size_t awaiting_readoption() const { return awaiting_.size(); }

 private:
  struct JobEntry {
    v1::Job job;
    int64_t number = 0;  // submit order
    // Members that reported READY / COMPLETED for the current generation.
    absl::flat_hash_map<std::string, bool> ready;
    absl::flat_hash_map<std::string, bool> completed;
    bool dirty = false;  // persisted copy is stale (a Put failed)
  };
  struct Awaited {
    JobId job;
    absl::Time deadline;
  };

  JobEntry* FindEntry(const JobId& id);
  const JobEntry* FindEntry(const JobId& id) const;
  static bool IsTerminal(v1::JobState state);
  bool IsMember(const JobEntry& entry, const WorkerId& worker) const;

  // Tries to start pending jobs and grow running ones.
  void Schedule(absl::Time now, Effects* effects);
  // Re-plans an active job over its remaining members plus idle workers.
  // `only_if_larger` restricts it to growth.
  void Replan(JobEntry& entry, const std::string& reason, bool only_if_larger, absl::Time now,
              Effects* effects);
  // Installs `mesh` as the next generation and tells every worker involved.
  void ApplyMesh(JobEntry& entry, v1::Mesh mesh, const std::string& reason, absl::Time now,
                 Effects* effects);
  // Stops all members and moves the job to a terminal state.
  void Finish(JobEntry& entry, v1::JobState state, const std::string& message, absl::Time now,
              Effects* effects);
  // Drops a member from the job's mesh and membership.
  void RemoveMember(JobEntry& entry, const WorkerId& worker);

  void SetState(JobEntry& entry, v1::JobState state, const std::string& message, absl::Time now,
                Effects* effects);
  void SetMessage(JobEntry& entry, const std::string& message, absl::Time now);
  void Persist(JobEntry& entry);
  void Emit(const JobEntry& entry, v1::JobEventKind kind, Effects* effects) const;
  void SendStop(const WorkerId& worker, const JobId& job, Generation generation,
                const std::string& reason, Effects* effects) const;

  Options options_;
  MembershipTable* membership_;
  JobStore* store_;
  std::map<JobId, JobEntry> jobs_;
  std::vector<JobId> order_;  // submit order
  absl::flat_hash_map<WorkerId, Awaited> awaiting_;
};

}  // namespace cohort::coordinator
