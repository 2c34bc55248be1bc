#include "worker/agent/worker_protocol.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/layout/mesh_proto.h"
#include "common/log.h"
#include "worker/comm/failed_peer.h"

namespace cohort::worker {
namespace {

// The worker behind the peer `why` names (comm::FailedPeer: a participant of
// `assignment`'s generation), as the coordinator knows it; none if unnamed.
std::vector<std::string> UnreachableWorkers(const Assignment& assignment, const absl::Status& why) {
  const std::optional<int> peer = comm::FailedPeer(why);
  if (!peer.has_value()) return {};
  const int members = assignment.mesh.members_size();
  if (*peer < members) {
    for (const v1::MeshMember& m : assignment.mesh.members()) {
      if (m.coordinates().rank() == *peer) return {m.worker_id()};
    }
    return {};
  }
  const int donor = *peer - members;
  if (assignment.recovery.kind() == v1::RECOVERY_KIND_PEER &&
      donor < assignment.recovery.donors_size()) {
    return {assignment.recovery.donors(donor).worker_id()};
  }
  return {};
}

std::string CoordinatesString(const v1::MeshCoordinates& c) {
  return absl::StrCat("rank ", c.rank(), " (data ", c.data(), ", tensor ", c.tensor(),
                      ", pipeline ", c.pipeline(), ")");
}

std::string MeshString(const v1::Mesh& mesh) {
  return absl::StrCat(layout::DegreesText(mesh), " (data x tensor x pipeline)");
}

// The place a WarmUp names (an empty job id: release).
Assignment WarmSlotOf(const v1::WarmUp& warm) {
  Assignment slot;
  slot.job_id = JobId(warm.job_id());
  slot.generation = Generation(warm.generation());
  slot.spec = warm.spec();
  slot.mesh = warm.mesh();
  slot.coordinates = warm.coordinates();
  slot.participant = warm.coordinates().rank();
  return slot;
}

CommandDecision Nothing(std::string why = "") {
  CommandDecision decision;
  decision.why = std::move(why);
  return decision;
}

CommandDecision Answer(v1::AssignmentStatus status,
                    CommandDecision::Kind kind = CommandDecision::Kind::kSay) {
  CommandDecision decision;
  decision.kind = kind;
  decision.status = std::move(status);
  return decision;
}

}  // namespace

PrepareOutcome PrepareOutcomeOf(const absl::Status& prepared) {
  if (prepared.ok()) return PrepareOutcome::kReady;
  if (absl::IsUnavailable(prepared) || absl::IsAborted(prepared) ||
      absl::IsCancelled(prepared) || absl::IsDeadlineExceeded(prepared)) {
    return PrepareOutcome::kCutShort;
  }
  return PrepareOutcome::kFailed;
}

v1::AssignmentStatus NewStatus(const JobId& job, Generation generation, v1::AssignmentState state,
                               const std::string& message,
                               const std::vector<v1::HeldState>& held) {
  v1::AssignmentStatus status;
  status.set_job_id(job.value());
  status.set_generation(generation.value());
  status.set_state(state);
  status.set_message(message);
  for (const v1::HeldState& h : held) *status.add_held_states() = h;
  return status;
}

WorkerProtocol::WorkerProtocol(std::string worker_id) : worker_id_(std::move(worker_id)) {}

std::optional<v1::HeldAssignment> WorkerProtocol::HeldForHello() const {
  if (!held_.has_value()) return std::nullopt;
  v1::HeldAssignment held;
  held.set_job_id(held_->job_id.value());
  held.set_generation(held_->generation.value());
  *held.mutable_coordinates() = held_->coordinates;
  return held;
}

void WorkerProtocol::OnWelcome(const v1::Welcome& welcome, const v1::Progress& progress) {
  // Generations are the coordinator's: another coordinator (an empty data
  // dir may reuse job ids) starts the count afresh.
  if (welcome.coordinator_id() != coordinator_id_) {
    newest_generation_.clear();
    last_warm_sequence_ = 0;
  }
  coordinator_id_ = welcome.coordinator_id();
  if (!held_.has_value() || held_state_ != v1::ASSIGNMENT_STATE_COMPLETED) return;
  for (const v1::AssignmentStatus& status : pending_) {
    if (status.job_id() == held_->job_id.value() &&
        status.generation() == held_->generation.value() &&
        status.state() == v1::ASSIGNMENT_STATE_COMPLETED) {
      return;  // still going out
    }
  }
  v1::AssignmentStatus status =
      NewStatus(held_->job_id, held_->generation, v1::ASSIGNMENT_STATE_COMPLETED);
  *status.mutable_progress() = progress;
  Say(std::move(status));
}

std::optional<CommandTarget> InterruptTargetOf(const v1::CoordinatorMessage& message) {
  if (!message.has_suspend() && !message.has_stop()) return std::nullopt;
  return CommandTargetOf(message);
}

void WorkerProtocol::Receive(const v1::CoordinatorMessage& message) {
  switch (message.kind_case()) {
    case v1::CoordinatorMessage::kAssign:
    case v1::CoordinatorMessage::kReconfigure:
    case v1::CoordinatorMessage::kSuspend:
    case v1::CoordinatorMessage::kStop:
    case v1::CoordinatorMessage::kWarmUp:
    case v1::CoordinatorMessage::kDrain:
      commands_.push_back(message);
      return;
    default:
      return;
  }
}

std::optional<v1::CoordinatorMessage> WorkerProtocol::NextCommand() {
  while (!commands_.empty()) {
    v1::CoordinatorMessage command = std::move(commands_.front());
    commands_.pop_front();
    if (!IsStale(command)) return command;
  }
  return std::nullopt;
}

bool WorkerProtocol::IsStale(const v1::CoordinatorMessage& command) {
  const std::optional<CommandTarget> target = CommandTargetOf(command);
  if (!target.has_value()) return false;
  const std::string& job = target->job_id;
  uint64_t& newest = newest_generation_[job];
  if (target->generation < newest) {
    // Even with nothing held (a donor that handed its state over, a stopped
    // member), a command older than one already executed was overtaken.
    LOG(INFO) << "ignoring a command of job " << job << " generation " << target->generation
              << ": generation " << newest << " was already commanded";
    return true;
  }
  newest = target->generation;
  if (newest_generation_.size() > kMaxRememberedJobs) {
    for (auto it = newest_generation_.begin(); it != newest_generation_.end(); ++it) {
      if (it->first != job) {
        newest_generation_.erase(it);
        break;
      }
    }
  }
  return false;
}

CommandDecision WorkerProtocol::Decide(const v1::CoordinatorMessage& command) {
  switch (command.kind_case()) {
    case v1::CoordinatorMessage::kAssign:
      return DecideAssign(command.assign());
    case v1::CoordinatorMessage::kReconfigure:
      return DecideReconfigure(command.reconfigure());
    case v1::CoordinatorMessage::kStop:
      return DecideStop(command.stop());
    case v1::CoordinatorMessage::kSuspend:
      return DecideSuspend(command.suspend());
    case v1::CoordinatorMessage::kWarmUp:
      return DecideWarmUp(command.warm_up());
    case v1::CoordinatorMessage::kDrain: {
      LOG(INFO) << "draining: " << command.drain().reason();
      CommandDecision decision;
      decision.kind = CommandDecision::Kind::kDrain;
      return decision;
    }
    default:
      return Nothing();
  }
}

CommandDecision WorkerProtocol::DecideAssign(const v1::Assign& assign) {
  const JobId job(assign.job_id());
  const Generation generation(assign.generation());
  CommandDecision decision;
  if (held_.has_value() && held_->job_id == job) {
    if (generation < held_->generation) {
      LOG(INFO) << "ignoring stale Assign of job " << job << " generation " << generation
                << " (holding generation " << held_->generation << ")";
      return Nothing();
    }
    if (generation == held_->generation) {
      LOG(INFO) << "repeated Assign of job " << job << " generation " << generation
                << "; answering with the held state";
      return Answer(NewStatus(job, generation, held_state_));
    }
  } else if (held_.has_value()) {
    LOG(WARNING) << "Assign of job " << job << " replaces held job " << held_->job_id
                 << " (no Stop came first)";
    decision.stop_first = true;
  }
  LOG(INFO) << "assigned job " << job << " generation " << generation << " at "
            << CoordinatesString(assign.coordinates()) << " of mesh " << MeshString(assign.mesh());
  decision.kind = CommandDecision::Kind::kPrepare;
  Assignment& assignment = decision.assignment;
  assignment.job_id = job;
  assignment.generation = generation;
  assignment.spec = assign.spec();
  assignment.mesh = assign.mesh();
  assignment.coordinates = assign.coordinates();
  assignment.recovery = assign.recovery();
  assignment.participant = assign.coordinates().rank();
  return decision;
}

CommandDecision WorkerProtocol::DecideReconfigure(const v1::Reconfigure& reconfigure) {
  const JobId job(reconfigure.job_id());
  const Generation generation(reconfigure.generation());
  const bool holds = held_.has_value() && held_->job_id == job;
  if (holds && generation < held_->generation) {
    LOG(INFO) << "ignoring stale Reconfigure of job " << job << " generation " << generation
              << " (holding generation " << held_->generation << ")";
    return Nothing();
  }
  if (holds && generation == held_->generation) {
    LOG(INFO) << "repeated Reconfigure of job " << job << " generation " << generation
              << "; answering with the held state";
    return Answer(NewStatus(job, generation, held_state_),
               held_state_ == v1::ASSIGNMENT_STATE_SUSPENDED
                   ? CommandDecision::Kind::kSayHeldStates
                   : CommandDecision::Kind::kSay);
  }
  if (!holds) {
    if (reconfigure.role() != v1::RECONFIGURE_ROLE_DONOR && reconfigure.has_spec()) {
      // Its Assign of an earlier generation was overtaken (or lost): the
      // Reconfigure carries all an Assign would; that Assign, if it still
      // comes, is stale.
      LOG(INFO) << "Reconfigure of job " << job << " generation " << generation
                << " before any Assign of it; joining from the Reconfigure";
      v1::Assign assign;
      assign.set_job_id(reconfigure.job_id());
      assign.set_generation(reconfigure.generation());
      *assign.mutable_spec() = reconfigure.spec();
      *assign.mutable_mesh() = reconfigure.mesh();
      *assign.mutable_coordinates() = reconfigure.coordinates();
      *assign.mutable_recovery() = reconfigure.recovery();
      return DecideAssign(assign);
    }
    LOG(WARNING) << "Reconfigure of job " << job << " which this worker does not hold";
    return Answer(NewStatus(job, generation, v1::ASSIGNMENT_STATE_FAILED,
                         absl::StrCat("worker ", worker_id_, " does not hold job ", job.value(),
                                      "; it needs an Assign")));
  }
  LOG(INFO) << "reconfigure job " << job << " generation " << held_->generation << " -> "
            << generation << " (" << reconfigure.reason() << "): now at "
            << CoordinatesString(reconfigure.coordinates()) << " of mesh "
            << MeshString(reconfigure.mesh());
  CommandDecision decision;
  Assignment& next = decision.assignment;
  next = *held_;
  next.generation = generation;
  next.mesh = reconfigure.mesh();
  next.coordinates = reconfigure.coordinates();
  next.recovery = reconfigure.recovery();
  next.donor = reconfigure.role() == v1::RECONFIGURE_ROLE_DONOR;
  next.participant = reconfigure.coordinates().rank();
  if (!next.donor) {
    decision.kind = CommandDecision::Kind::kPrepare;
    return decision;
  }
  decision.kind = CommandDecision::Kind::kDonate;
  next.participant = -1;
  for (int i = 0; i < reconfigure.recovery().donors_size(); ++i) {
    if (reconfigure.recovery().donors(i).worker_id() == worker_id_) {
      next.participant = reconfigure.mesh().members_size() + i;
    }
  }
  if (next.participant < 0) {
    decision.donate_refused = absl::InvalidArgumentError("not among the plan's donors");
  }
  LOG(INFO) << "donating this worker's state of job " << job << " to generation " << generation
            << " as participant " << next.participant;
  return decision;
}

CommandDecision WorkerProtocol::DecideStop(const v1::Stop& stop) {
  const JobId job(stop.job_id());
  const Generation generation(stop.generation());
  CommandDecision decision;
  decision.kind = CommandDecision::Kind::kStop;
  decision.stop_trainer = held_.has_value() && held_->job_id == job;
  if (decision.stop_trainer && generation < held_->generation) {
    LOG(INFO) << "ignoring stale Stop of job " << job << " generation " << generation
              << " (holding generation " << held_->generation << ")";
    return Nothing();
  }
  if (decision.stop_trainer) {
    LOG(INFO) << "stopping job " << job << " generation " << generation << ": " << stop.reason();
  } else {
    LOG(INFO) << "Stop of job " << job << " which this worker does not hold; answering RELEASED";
  }
  return decision;
}

CommandDecision WorkerProtocol::DecideSuspend(const v1::Suspend& suspend) {
  const JobId job(suspend.job_id());
  const Generation generation(suspend.generation());
  if (held_.has_value() && held_->job_id == job && generation < held_->generation) {
    LOG(INFO) << "ignoring stale Suspend of job " << job << " generation " << generation
              << " (holding generation " << held_->generation << ")";
    return Nothing();
  }
  if (!held_.has_value() || held_->job_id != job) {
    // Nothing of this job here: say so (SUSPENDED, nothing held), so the
    // coordinator does not wait.
    LOG(INFO) << "Suspend of job " << job << " which this worker does not hold";
  }
  CommandDecision decision;
  decision.kind = CommandDecision::Kind::kSuspend;
  return decision;
}

CommandDecision WorkerProtocol::DecideWarmUp(const v1::WarmUp& warm) {
  // Queued with the commands (the trainer prepares in the background, and a
  // Prepare after it takes or releases what it prepared), but two
  // coordinator calls' messages can cross: an older one is dropped.
  if (warm.sequence() <= last_warm_sequence_) return Nothing();
  last_warm_sequence_ = warm.sequence();
  if (!warm.job_id().empty() && held_.has_value() &&
      held_state_ != v1::ASSIGNMENT_STATE_COMPLETED) {
    std::string why =
        absl::StrCat("a WarmUp of ", warm.job_id(), ": it holds ", held_->job_id.value());
    LOG(INFO) << "ignoring " << why << " (taken into it since)";
    return Nothing(std::move(why));
  }
  CommandDecision decision;
  decision.kind = CommandDecision::Kind::kWarm;
  decision.assignment = WarmSlotOf(warm);
  return decision;
}

void WorkerProtocol::Hold(const Assignment& assignment) {
  held_ = assignment;
  held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
}

v1::AssignmentStatus WorkerProtocol::FinishPrepare(const Assignment& assignment,
                                                   const absl::Status& prepared,
                                                   const std::vector<v1::HeldState>& kept,
                                                   const v1::PreparePhases& phases) {
  const JobId& job = assignment.job_id;
  const Generation generation = assignment.generation;
  const bool holds_job = held_.has_value() && held_->job_id == job;
  switch (PrepareOutcomeOf(prepared)) {
    case PrepareOutcome::kReady: {
      if (holds_job && held_->generation == generation) {
        held_state_ = v1::ASSIGNMENT_STATE_READY;
      }
      LOG(INFO) << "ready for job " << job << " generation " << generation;
      v1::AssignmentStatus status = NewStatus(job, generation, v1::ASSIGNMENT_STATE_READY);
      *status.mutable_prepare() = phases;
      return status;
    }
    case PrepareOutcome::kCutShort: {
      // A peer or the coordinator went away: not this job's failure. The
      // state held before stays; the coordinator re-plans.
      LOG(WARNING) << "preparing job " << job << " generation " << generation
                   << " was cut short: " << prepared << "; waiting for a new plan";
      if (holds_job) held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
      v1::AssignmentStatus status = NewStatus(job, generation, v1::ASSIGNMENT_STATE_SUSPENDED,
                                              prepared.ToString(), kept);
      for (const std::string& worker : UnreachableWorkers(assignment, prepared)) {
        status.add_unreachable_workers(worker);
      }
      return status;
    }
    case PrepareOutcome::kFailed:
      break;
  }
  LOG(ERROR) << "cannot run job " << job << " generation " << generation << ": " << prepared;
  held_.reset();
  held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  return NewStatus(job, generation, v1::ASSIGNMENT_STATE_FAILED, prepared.ToString());
}

v1::AssignmentStatus WorkerProtocol::FinishDonate(const Assignment& assignment,
                                                  const absl::Status& donated) {
  if (donated.ok()) {
    held_.reset();
    held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  } else {
    // The trainer keeps the source state (EngineTrainer::Donate): the
    // coordinator asks for it in its next re-plan, which may make this worker
    // a member or a donor again, or release it.
    held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
    LOG(WARNING) << "donating to job " << assignment.job_id << ": " << donated;
  }
  return NewStatus(assignment.job_id, assignment.generation, v1::ASSIGNMENT_STATE_DONATED,
                   donated.ok() ? "" : donated.ToString());
}

v1::AssignmentStatus WorkerProtocol::FinishSuspend(const v1::Suspend& suspend,
                                                   const std::vector<v1::HeldState>& kept) {
  const JobId job(suspend.job_id());
  if (held_.has_value() && held_->job_id == job) held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
  LOG(INFO) << "suspended job " << job << " generation " << suspend.generation() << " ("
            << suspend.reason() << "): holding " << kept.size() << " consistent state(s)"
            << (kept.empty() ? "" : absl::StrCat(", newest step ", kept[0].step(), " of generation ",
                                                 kept[0].generation()));
  return NewStatus(job, Generation(suspend.generation()), v1::ASSIGNMENT_STATE_SUSPENDED,
                   suspend.reason(), kept);
}

v1::AssignmentStatus WorkerProtocol::FinishStop(const v1::Stop& stop) {
  const JobId job(stop.job_id());
  if (held_.has_value() && held_->job_id == job) {
    held_.reset();
    held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  }
  return NewStatus(job, Generation(stop.generation()), v1::ASSIGNMENT_STATE_RELEASED);
}

std::optional<v1::AssignmentStatus> WorkerProtocol::FinishDrain(const v1::Drain& drain) {
  std::optional<Assignment> released = std::move(held_);
  held_.reset();
  held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  if (!released.has_value()) return std::nullopt;
  return NewStatus(released->job_id, released->generation, v1::ASSIGNMENT_STATE_RELEASED,
                   absl::StrCat("drained: ", drain.reason()));
}

std::optional<v1::AssignmentStatus> WorkerProtocol::TrainingFinished(const JobId& job,
                                                                     Generation generation,
                                                                     const absl::Status& status) {
  if (!held_.has_value() || held_->job_id != job || held_->generation != generation) {
    LOG(INFO) << "training of job " << job << " generation " << generation
              << " ended after the assignment changed; not reported";
    return std::nullopt;
  }
  held_state_ = status.ok() ? v1::ASSIGNMENT_STATE_COMPLETED : v1::ASSIGNMENT_STATE_FAILED;
  if (status.ok()) {
    LOG(INFO) << "job " << job << " generation " << generation << " completed";
  } else {
    LOG(ERROR) << "job " << job << " generation " << generation << " failed: " << status;
  }
  return NewStatus(job, generation, held_state_, status.ok() ? "" : status.ToString());
}

std::optional<v1::AssignmentStatus> WorkerProtocol::TrainingSuspended(
    const JobId& job, Generation generation, const std::vector<v1::HeldState>& kept,
    const absl::Status& why) {
  if (!held_.has_value() || held_->job_id != job || held_->generation != generation) {
    return std::nullopt;
  }
  held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
  v1::AssignmentStatus status = NewStatus(job, generation, v1::ASSIGNMENT_STATE_SUSPENDED,
                                          std::string(why.message()), kept);
  for (const std::string& worker : UnreachableWorkers(*held_, why)) {
    status.add_unreachable_workers(worker);
  }
  return status;
}

bool WorkerProtocol::Say(v1::AssignmentStatus status) {
  bool kept_all = true;
  if (pending_.size() >= kMaxPendingStatuses) {
    LOG(WARNING) << "dropping undelivered status of job " << pending_.front().job_id()
                 << " generation " << pending_.front().generation();
    pending_.pop_front();
    kept_all = false;
  }
  pending_.push_back(std::move(status));
  return kept_all;
}

const v1::AssignmentStatus* WorkerProtocol::NextPending() const {
  return pending_.empty() ? nullptr : &pending_.front();
}

void WorkerProtocol::PopPending() {
  if (!pending_.empty()) pending_.pop_front();
}

}  // namespace cohort::worker
