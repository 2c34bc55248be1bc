#pragma once
// JobEntry: everything the coordinator keeps about one job besides its
// record's fields (v1::Job): who reported READY or COMPLETED, the re-plan in
// progress (Suspension), members that may come back with the job's state
// (Returning), recovery timings, stall detection. Plain data shared by the
// job classes (JobTable owns the entries; Scheduler, Replanner, WarmSpares
// and JobManager read and change them); not thread-safe.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "cohort/v1/job.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"
#include "coordinator/membership/reachability.h"
#include "coordinator/membership/stall_detector.h"

namespace cohort::coordinator {

// Phase 1 of a re-plan (job_manager.h, "Re-planning"; Replanner).
struct Suspension {
  std::string reason;
  absl::Time started;   // when the change was noticed
  absl::Time deadline;  // for the answers
  absl::flat_hash_set<WorkerId> awaiting;
  // Survivors holding state in the live state's layout: worker -> step.
  std::map<std::string, int64_t> holders;
  bool growth = false;                      // nobody was lost: a growth or a scale
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
  // When the job finished (its key in JobTable's finished index); unset
  // while it runs.
  std::optional<absl::Time> finished_at;
};
// A member awaited after a coordinator restart (or a stream taken over):
// re-adopted if it re-attaches in its place before the deadline.
struct Awaited {
  JobId job;
  absl::Time deadline;
};

inline bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// A mesh that lost members and could not yet be re-planned.
inline bool MeshIncomplete(const v1::Mesh& mesh) {
  return mesh.members_size() !=
         mesh.data_parallel() * mesh.tensor_parallel() * mesh.pipeline_parallel();
}

// Whether `worker` is in the mesh of `entry`'s unfinished job.
inline bool IsMember(const JobEntry& entry, const WorkerId& worker) {
  if (IsTerminal(entry.job.state())) return false;
  for (const auto& member : entry.job.mesh().members()) {
    if (member.worker_id() == worker.value()) return true;
  }
  return false;
}

}  // namespace cohort::coordinator
