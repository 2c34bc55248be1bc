#pragma once
// MembershipTable: which workers exist, their incarnations and states, and the
// heartbeat failure detector. Pure logic: every method takes `now`; no I/O,
// no threads. Not thread-safe (the Coordinator serialises calls).
//
// Worker state machine:
//
//   Join --> IDLE <--> ASSIGNED        (AssignToJob / Release)
//              \        /
//               v      v
//                 LOST            (MarkLost: stream broken; Expire: heartbeat timeout)
//   IDLE/ASSIGNED --> DRAINING    (MarkDraining; leaves on Release)
//
// A Join with the same worker id and a different incarnation replaces the old
// record at once (the old process is dead or fenced): JoinResult says which job
// the replaced incarnation held so the caller can treat it as a failure.
// Messages carrying an incarnation other than the current one get Aborted.
// LOST records stay listed for `lost_retention` and are then forgotten.

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"

namespace cohort::coordinator {

enum class WorkerState { kIdle, kAssigned, kLost, kDraining };
// kLeft: the worker said it was leaving (shutdown or drain); not a failure.
// kHang: fenced by the job manager (silent when asked to suspend, or its
// job stalled while it was not waiting for peers).
enum class LossReason { kStreamBroken, kHeartbeatTimeout, kReplaced, kLeft, kHang };

const char* WorkerStateName(WorkerState state);  // "idle", "assigned", ...
const char* LossReasonName(LossReason reason);   // "stream_broken", ...

struct WorkerRecord {
  WorkerId id;
  Incarnation incarnation;
  std::string host;
  v1::DeviceKind device_kind = v1::DEVICE_KIND_CPU;
  int32_t device_index = 0;
  v1::Capabilities capabilities;
  std::string metrics_address;
  WorkerState state = WorkerState::kIdle;
  // Set while ASSIGNED (and DRAINING out of a job); cleared on LOST, where the
  // job travels in the LostWorker instead.
  std::optional<JobId> job;
  absl::Time joined_at;
  absl::Time last_heartbeat;
  absl::Time lost_at;  // valid in LOST
  std::optional<LossReason> loss_reason;
  // What the worker's last heartbeat said it prepared as a warm spare.
  v1::WarmSpare warm;
};

struct JoinResult {
  // True when an earlier incarnation of the same worker id was replaced
  // (whether it was live or already LOST).
  bool replaced_previous = false;
  // The job the replaced incarnation was assigned to, if it was live (not yet
  // LOST) and in a job: the caller treats this as that job losing a member.
  // A LOST predecessor's job was already reported by MarkLost / Expire.
  std::optional<JobId> previous_job;
  // The same incarnation on a new stream while its record was live: the
  // record is kept (heard from now). An ASSIGNED worker comes back IDLE
  // with its job here, for the caller to re-adopt in place.
  bool took_over = false;
  std::optional<JobId> readopt_into;
};

struct LostWorker {
  WorkerId id;
  Incarnation incarnation;
  std::optional<JobId> job;  // job it was assigned to when lost
  LossReason reason;
  absl::Duration silence;  // time since the last heartbeat when detected
  // Already awaited for a grace period (re-adoption after a restart or a
  // stall) that ended without it: not awaited again.
  bool grace_expired = false;
};

class MembershipTable {
 public:
  struct Options {
    absl::Duration heartbeat_timeout = absl::Seconds(3);
    absl::Duration lost_retention = absl::Minutes(10);
  };
  explicit MembershipTable(Options options);

  // Registers a worker from its Hello. InvalidArgument if worker_id is empty,
  // incarnation is 0 or device_kind is unspecified. The same (id,
  // incarnation) while not LOST is a take-over (JoinResult::took_over)
  // when the Hello names the same host and device, else AlreadyExists. A
  // LOST record with the same incarnation comes back (state IDLE).
  absl::StatusOr<JoinResult> Join(const v1::Hello& hello, absl::Time now);

  // Records a heartbeat. NotFound for an unknown id; Aborted if the
  // incarnation is not the current one; FailedPrecondition if LOST.
  absl::Status Heartbeat(const WorkerId& id, Incarnation incarnation, absl::Time now);

  // Records what the worker says it prepared as a warm spare (from the
  // heartbeat Heartbeat() accepted; empty: nothing). Bounded: a job id over
  // 160 characters drops the report, a message is cut to 512. No-op for an
  // unknown worker.
  void SetWarm(const WorkerId& id, const v1::WarmSpare& warm);

  // Marks the worker lost (its stream broke). Returns the LostWorker, or
  // nullopt if the incarnation is not current (an old stream closing after a
  // replacement) or it is already LOST.
  std::optional<LostWorker> MarkLost(const WorkerId& id, Incarnation incarnation, LossReason reason,
                                     absl::Time now);

  // Marks every non-LOST worker silent for longer than heartbeat_timeout as
  // LOST (reason kHeartbeatTimeout) and returns them (none before the time
  // ExcuseSilenceUntil set); forgets LOST records older than lost_retention.
  std::vector<LostWorker> Expire(absl::Time now);
  // No heartbeat timeouts before `until` (after the coordinator's own
  // isolation: the silent workers get time to re-attach).
  void ExcuseSilenceUntil(absl::Time until) { excused_until_ = std::max(excused_until_, until); }
  // When a worker was last heard (a Hello or heartbeat of a worker not LOST
  // at the time; it may have been lost since), if at least `min_workers`
  // (>= 1) are not LOST now. O(1): the coordinator asks on every tick.
  std::optional<absl::Time> NewestHeartbeat(int min_workers) const;

  // The coordinator itself did not run for `gap` (ending at `now`): heartbeat
  // ages do not count it (each last heartbeat moves later by `gap`, at most
  // to now), so workers are not declared lost for the coordinator's stall.
  void Discount(absl::Duration gap, absl::Time now);

  // IDLE -> ASSIGNED. FailedPrecondition unless IDLE (or already in `job`).
  absl::Status AssignToJob(const WorkerId& id, const JobId& job);
  // ASSIGNED -> IDLE (DRAINING stays DRAINING but leaves the job). No-op for
  // unknown or LOST workers.
  void Release(const WorkerId& id);
  // IDLE/ASSIGNED -> DRAINING. NotFound / FailedPrecondition (LOST).
  absl::Status MarkDraining(const WorkerId& id);

  const WorkerRecord* Find(const WorkerId& id) const;
  // All records, sorted by worker id.
  std::vector<const WorkerRecord*> List() const;
  // Visits the IDLE workers of `kind` in (host, device_index, id) order
  // until `visit` returns false. From an index kept by every state change:
  // no scan of all workers, no sort, no copy; O(visited), for callers that
  // need the first few of thousands (a copy of every idle worker per
  // scheduling pass was most of a busy coordinator's CPU).
  void ForEachIdle(v1::DeviceKind kind,
                   absl::FunctionRef<bool(const WorkerRecord& record)> visit) const;
  // Whether `a` comes before `b` in ForEachIdle's order.
  static bool IdleBefore(const WorkerRecord& a, const WorkerRecord& b);
  bool HasIdle(v1::DeviceKind kind) const;
  // Counts kept by every state change (no scan): records in `state`, and
  // attached (not LOST) workers of `kind`.
  int CountInState(WorkerState state) const;
  int CountAttached(v1::DeviceKind kind) const;
  size_t size() const { return workers_.size(); }
  const Options& options() const { return options_; }

 private:
  // Moves `record` to `state`, keeping idle_ and the counts in step (every
  // state change of a record in workers_ goes through here; a record's
  // device kind changes only while it is LOST).
  void SetState(WorkerRecord& record, WorkerState state);
  void IndexIdle(const WorkerRecord& record);
  void UnindexIdle(const WorkerRecord& record);

  struct IdleOrder {
    bool operator()(const WorkerRecord* a, const WorkerRecord* b) const;
  };

  Options options_;
  absl::Time excused_until_ = absl::InfinitePast();
  // Node-based: records do not move, so the idle index can point at them.
  absl::node_hash_map<WorkerId, WorkerRecord> workers_;
  std::array<int, 4> in_state_{};  // by WorkerState
  absl::Time newest_heartbeat_ = absl::InfinitePast();
  void Heard(absl::Time now) { newest_heartbeat_ = std::max(newest_heartbeat_, now); }
  absl::flat_hash_map<int, int> attached_;  // by v1::DeviceKind
  // IDLE records by device kind, in (host, device_index, id) order.
  std::map<v1::DeviceKind, std::set<const WorkerRecord*, IdleOrder>> idle_;
};

}  // namespace cohort::coordinator
