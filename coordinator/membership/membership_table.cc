#include "coordinator/membership/membership_table.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/membership/hello_validator.h"

namespace cohort::coordinator {

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle:
      return "idle";
    case WorkerState::kAssigned:
      return "assigned";
    case WorkerState::kLost:
      return "lost";
    case WorkerState::kDraining:
      return "draining";
  }
  return "unknown";
}

const char* LossReasonName(LossReason reason) {
  switch (reason) {
    case LossReason::kStreamBroken:
      return "stream_broken";
    case LossReason::kHeartbeatTimeout:
      return "heartbeat_timeout";
    case LossReason::kReplaced:
      return "replaced";
    case LossReason::kLeft:
      return "left";
    case LossReason::kHang:
      return "hang";
  }
  return "unknown";
}

namespace {

// Describes the loss of `record` (about to become LOST). The job moves into
// the LostWorker: a LOST record belongs to no job any more.
LostWorker MakeLost(WorkerRecord& record, LossReason reason, absl::Time now) {
  LostWorker lost{record.id, record.incarnation, std::move(record.job), reason,
                  now - record.last_heartbeat};
  record.job.reset();
  record.lost_at = now;
  record.loss_reason = reason;
  return lost;
}

void FillFromHello(const v1::Hello& hello, absl::Time now, WorkerRecord& record) {
  record.id = WorkerId(hello.worker_id());
  record.incarnation = Incarnation(hello.incarnation());
  record.host = hello.host();
  record.device_kind = hello.device_kind();
  record.device_index = hello.device_index();
  record.capabilities = hello.capabilities();
  record.metrics_address = hello.metrics_address();
  record.job.reset();
  record.joined_at = now;
  record.last_heartbeat = now;
  record.lost_at = absl::InfinitePast();
  record.loss_reason.reset();
}

}  // namespace

MembershipTable::MembershipTable(Options options) : options_(options) {}

bool MembershipTable::IdleBefore(const WorkerRecord& a, const WorkerRecord& b) {
  return std::tie(a.host, a.device_index, a.id) < std::tie(b.host, b.device_index, b.id);
}

bool MembershipTable::IdleOrder::operator()(const WorkerRecord* a, const WorkerRecord* b) const {
  return IdleBefore(*a, *b);
}

void MembershipTable::IndexIdle(const WorkerRecord& record) {
  idle_[record.device_kind].insert(&record);
}

void MembershipTable::UnindexIdle(const WorkerRecord& record) {
  auto kind = idle_.find(record.device_kind);
  if (kind != idle_.end()) kind->second.erase(&record);
}

void MembershipTable::SetState(WorkerRecord& record, WorkerState state) {
  if (record.state == state) return;
  if (record.state == WorkerState::kIdle) UnindexIdle(record);
  if (record.state != WorkerState::kLost) --attached_[record.device_kind];
  --in_state_[static_cast<size_t>(record.state)];
  record.state = state;
  if (state == WorkerState::kLost) record.warm.Clear();  // its process may be gone
  ++in_state_[static_cast<size_t>(state)];
  if (state != WorkerState::kLost) ++attached_[record.device_kind];
  if (state == WorkerState::kIdle) IndexIdle(record);
}

absl::StatusOr<JoinResult> MembershipTable::Join(const v1::Hello& hello, absl::Time now) {
  if (absl::Status valid = ValidateHello(hello); !valid.ok()) return valid;
  if (hello.incarnation() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.incarnation: worker ", hello.worker_id(),
                     " sent incarnation 0; every process start must pick a random non-zero value"));
  }
  if (hello.device_kind() == v1::DEVICE_KIND_UNSPECIFIED ||
      !v1::DeviceKind_IsValid(hello.device_kind())) {
    return absl::InvalidArgumentError(absl::StrCat("hello.device_kind: worker ", hello.worker_id(),
                                                   " must say CPU or GPU, got ",
                                                   static_cast<int>(hello.device_kind())));
  }

  JoinResult result;
  const WorkerId id(hello.worker_id());
  auto [it, inserted] = workers_.try_emplace(id);
  WorkerRecord& record = it->second;
  // A new record is not indexed yet (kLost until filled below).
  if (inserted) {
    record.state = WorkerState::kLost;
    ++in_state_[static_cast<size_t>(WorkerState::kLost)];
  }
  if (!inserted) {
    if (record.incarnation.value() == hello.incarnation()) {
      if (record.state != WorkerState::kLost) {
        // A process opens a new stream only after giving its old one up, so
        // the old one is dead or dying: the new one takes the record over.
        // One claiming another host or device is not that process.
        if (record.host != hello.host() || record.device_kind != hello.device_kind() ||
            record.device_index != hello.device_index()) {
          return absl::AlreadyExistsError(absl::StrCat(
              "worker ", hello.worker_id(), " incarnation ", hello.incarnation(),
              " is already attached (", WorkerStateName(record.state), ") from host ",
              record.host, " device ", record.device_index, "; a stream claiming host ",
              hello.host(), " device ", hello.device_index(), " is refused"));
        }
        result.took_over = true;
        record.last_heartbeat = now;
        Heard(now);
        record.metrics_address = hello.metrics_address();
        if (record.state == WorkerState::kAssigned) {
          result.readopt_into = record.job;
          Release(id);
        }
        return result;
      }
      // The same process reconnecting after its stream broke: it comes back
      // IDLE; its old job already saw the loss.
    } else {
      // A new process under the same name: the old one is dead or fenced.
      result.replaced_previous = true;
      if (record.state != WorkerState::kLost) result.previous_job = record.job;
    }
  }
  // The index orders by host and device: out of it while they change.
  SetState(record, WorkerState::kLost);
  FillFromHello(hello, now, record);
  Heard(now);
  SetState(record, WorkerState::kIdle);
  return result;
}

absl::Status MembershipTable::Heartbeat(const WorkerId& id, Incarnation incarnation,
                                        absl::Time now) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", id.value(), " is not attached"));
  }
  WorkerRecord& record = it->second;
  if (record.incarnation != incarnation) {
    return absl::AbortedError(absl::StrCat("worker ", id.value(), " incarnation ",
                                           incarnation.value(), " is stale; current is ",
                                           record.incarnation.value()));
  }
  if (record.state == WorkerState::kLost) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", id.value(), " was declared lost (",
                     LossReasonName(record.loss_reason.value_or(LossReason::kStreamBroken)),
                     "); it must attach again"));
  }
  record.last_heartbeat = std::max(record.last_heartbeat, now);
  Heard(now);
  return absl::OkStatus();
}

std::optional<LostWorker> MembershipTable::MarkLost(const WorkerId& id, Incarnation incarnation,
                                                    LossReason reason, absl::Time now) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  WorkerRecord& record = it->second;
  if (record.incarnation != incarnation || record.state == WorkerState::kLost) {
    return std::nullopt;
  }
  LostWorker lost = MakeLost(record, reason, now);
  SetState(record, WorkerState::kLost);
  return lost;
}

std::vector<LostWorker> MembershipTable::Expire(absl::Time now) {
  // Called on every coordinator tick (50 ms by default) over up to ~10^4 records: one pass, no allocation
  // unless something is lost.
  std::vector<LostWorker> lost;
  const absl::Time silent_before = now - options_.heartbeat_timeout;
  const absl::Time forget_before = now - options_.lost_retention;
  for (auto it = workers_.begin(); it != workers_.end();) {
    WorkerRecord& record = it->second;
    if (record.state == WorkerState::kLost) {
      if (record.lost_at < forget_before) {
        // LOST, so not in the idle index; erase(iterator) leaves the other
        // iterators valid.
        --in_state_[static_cast<size_t>(WorkerState::kLost)];
        workers_.erase(it++);
        continue;
      }
    } else if (record.last_heartbeat < silent_before && now >= excused_until_) {
      lost.push_back(MakeLost(record, LossReason::kHeartbeatTimeout, now));
      SetState(record, WorkerState::kLost);
    }
    ++it;
  }
  // Hash order is arbitrary; callers and logs get a stable order.
  std::sort(lost.begin(), lost.end(),
            [](const LostWorker& a, const LostWorker& b) { return a.id < b.id; });
  return lost;
}

std::optional<absl::Time> MembershipTable::NewestHeartbeat(int min_workers) const {
  const int live =
      static_cast<int>(workers_.size()) - in_state_[static_cast<size_t>(WorkerState::kLost)];
  if (live < std::max(min_workers, 1) || newest_heartbeat_ == absl::InfinitePast()) {
    return std::nullopt;
  }
  return newest_heartbeat_;
}

void MembershipTable::Discount(absl::Duration gap, absl::Time now) {
  if (newest_heartbeat_ != absl::InfinitePast()) {
    newest_heartbeat_ = std::min(newest_heartbeat_ + gap, now);
  }
  for (auto& [id, record] : workers_) {
    if (record.state != WorkerState::kLost) {
      record.last_heartbeat = std::min(record.last_heartbeat + gap, now);
    }
  }
}

void MembershipTable::SetWarm(const WorkerId& id, const v1::WarmSpare& warm) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  if (warm.job_id().size() > 160) {
    it->second.warm.Clear();
    return;
  }
  it->second.warm = warm;
  if (warm.message().size() > 512) it->second.warm.mutable_message()->resize(512);
}

absl::Status MembershipTable::AssignToJob(const WorkerId& id, const JobId& job) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", id.value(), " is not attached"));
  }
  WorkerRecord& record = it->second;
  if (record.state == WorkerState::kAssigned && record.job == job) return absl::OkStatus();
  if (record.state != WorkerState::kIdle) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", id.value(), " is ", WorkerStateName(record.state),
                     record.job.has_value() ? absl::StrCat(" (job ", record.job->value(), ")") : "",
                     "; only idle workers can join job ", job.value()));
  }
  SetState(record, WorkerState::kAssigned);
  record.job = job;
  return absl::OkStatus();
}

void MembershipTable::Release(const WorkerId& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  WorkerRecord& record = it->second;
  switch (record.state) {
    case WorkerState::kAssigned:
      SetState(record, WorkerState::kIdle);
      record.job.reset();
      break;
    case WorkerState::kDraining:
      record.job.reset();
      break;
    case WorkerState::kIdle:
    case WorkerState::kLost:
      break;
  }
}

absl::Status MembershipTable::MarkDraining(const WorkerId& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", id.value(), " is not attached"));
  }
  WorkerRecord& record = it->second;
  if (record.state == WorkerState::kLost) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", id.value(), " is lost; there is nothing to drain"));
  }
  SetState(record, WorkerState::kDraining);
  return absl::OkStatus();
}

const WorkerRecord* MembershipTable::Find(const WorkerId& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<const WorkerRecord*> MembershipTable::List() const {
  std::vector<const WorkerRecord*> records;
  records.reserve(workers_.size());
  for (const auto& [id, record] : workers_) records.push_back(&record);
  std::sort(records.begin(), records.end(),
            [](const WorkerRecord* a, const WorkerRecord* b) { return a->id < b->id; });
  return records;
}

bool MembershipTable::HasIdle(v1::DeviceKind kind) const {
  auto it = idle_.find(kind);
  return it != idle_.end() && !it->second.empty();
}

void MembershipTable::ForEachIdle(v1::DeviceKind kind,
                                  absl::FunctionRef<bool(const WorkerRecord& record)> visit) const {
  auto it = idle_.find(kind);
  if (it == idle_.end()) return;
  for (const WorkerRecord* record : it->second) {
    if (!visit(*record)) return;
  }
}

int MembershipTable::CountInState(WorkerState state) const {
  return in_state_[static_cast<size_t>(state)];
}

int MembershipTable::CountAttached(v1::DeviceKind kind) const {
  auto it = attached_.find(kind);
  return it == attached_.end() ? 0 : it->second;
}

}  // namespace cohort::coordinator
