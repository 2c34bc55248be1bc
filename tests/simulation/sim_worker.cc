#include "tests/simulation/sim_worker.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/command_target.h"
#include "tests/simulation/sim_world.h"

namespace cohort::simulation {
namespace {

constexpr size_t kMaxPendingStatuses = 16;  // WorkerAgent::kMaxPendingStatuses
constexpr absl::Duration kBackoffInitial = absl::Milliseconds(100);
constexpr absl::Duration kBackoffMax = absl::Seconds(5);
constexpr absl::Duration kBackoffMaxHolding = absl::Seconds(1);
constexpr absl::Duration kWelcomeTimeout = absl::Seconds(5);

bool Retriable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsAborted(status) || absl::IsCancelled(status) ||
         absl::IsDeadlineExceeded(status);
}

const char* StateName(v1::AssignmentState state) {
  switch (state) {
    case v1::ASSIGNMENT_STATE_READY: return "READY";
    case v1::ASSIGNMENT_STATE_COMPLETED: return "COMPLETED";
    case v1::ASSIGNMENT_STATE_FAILED: return "FAILED";
    case v1::ASSIGNMENT_STATE_RELEASED: return "RELEASED";
    case v1::ASSIGNMENT_STATE_SUSPENDED: return "SUSPENDED";
    case v1::ASSIGNMENT_STATE_DONATED: return "DONATED";
    default: return "?";
  }
}

}  // namespace

SimWorker::SimWorker(World* world, int index)
    : world_(world), index_(index), id_(absl::StrCat("w", index)) {}

void SimWorker::FreezeUntil(absl::Time until) { frozen_until_ = std::max(frozen_until_, until); }

void SimWorker::Start() {
  ++incarnation_;
  alive_ = true;
  stream_ = 0;
  welcomed_ = false;
  pending_statuses_.clear();
  commands_.clear();
  busy_ = false;
  held_.reset();
  held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  newest_command_generation_.clear();
  commanded_generation_.clear();
  coordinator_id_.clear();
  last_warm_sequence_ = 0;
  warm_job_.clear();
  run_.reset();
  previous_.reset();
  phase_ = Phase::kIdle;
  ++train_epoch_;
  op_ = 0;
  op_done_ = nullptr;
  cancelled_ = false;
  interruptible_.reset();
  interrupted_.clear();
  backoff_ = kBackoffInitial;
  world_->Trace(absl::StrCat(id_, " starts (incarnation ", incarnation_, ")"));
  Connect();
}

void SimWorker::Crash() {
  if (!alive_) return;
  world_->Trace(absl::StrCat(id_, " crashes (kill -9)"));
  alive_ = false;
  world_->LeaveFabric(index_, incarnation_);
  if (stream_ != 0) world_->CancelStream(stream_);  // the kernel closes the socket
  stream_ = 0;
  run_.reset();
  previous_.reset();
}

// --- agent: streams and heartbeats ---

void SimWorker::Connect() {
  v1::WorkerMessage hello_message;
  hello_message.set_incarnation(incarnation_);
  v1::Hello* hello = hello_message.mutable_hello();
  hello->set_worker_id(id_);
  hello->set_host(absl::StrCat("host", index_ / 2));
  hello->set_device_kind(v1::DEVICE_KIND_CPU);
  hello->set_device_index(index_ % 2);
  hello->set_incarnation(incarnation_);
  if (held_.has_value()) {
    hello->mutable_held()->set_job_id(held_->job);
    hello->mutable_held()->set_generation(held_->generation);
    *hello->mutable_held()->mutable_coordinates() = held_->coordinates;
  }
  welcomed_ = false;
  last_received_ = world_->Now();
  stream_ = world_->OpenStream(index_, incarnation_, hello_message);
  const uint64_t stream = stream_;
  world_->AtWorker(index_, incarnation_, kWelcomeTimeout, [this, stream] {
    if (stream_ == stream && !welcomed_) AbandonStream("no Welcome within 5s");
  });
}

void SimWorker::Reconnect() {
  const absl::Duration cap = held_.has_value() ? kBackoffMaxHolding : kBackoffMax;
  const absl::Duration base = std::min(backoff_, cap);
  backoff_ = std::min(backoff_ * 2, kBackoffMax);
  const absl::Duration delay = world_->Uniform(base * 0.8, base * 1.2);
  world_->AtWorker(index_, incarnation_, delay, [this] {
    if (stream_ == 0) Connect();
  });
}

void SimWorker::AbandonStream(const std::string& why) {
  world_->Trace(absl::StrCat(id_, " abandons stream ", stream_, ": ", why));
  world_->CancelStream(stream_);
  stream_ = 0;
  welcomed_ = false;
  Reconnect();
}

void SimWorker::OnStreamEnded(uint64_t stream) {
  if (stream != stream_) return;
  world_->Trace(absl::StrCat(id_, " sees stream ", stream, " end"));
  stream_ = 0;
  welcomed_ = false;
  Reconnect();
}

void SimWorker::OnMessage(uint64_t stream, const v1::CoordinatorMessage& message) {
  if (stream != stream_) return;  // a stream this process already gave up
  last_received_ = world_->Now();
  switch (message.kind_case()) {
    case v1::CoordinatorMessage::kWelcome:
      OnWelcome(stream, message.welcome());
      return;
    case v1::CoordinatorMessage::kHeartbeatAck:
      return;
    case v1::CoordinatorMessage::kSuspend:
      // The reader thread interrupts a Prepare of the held job at once.
      InterruptFor(message.suspend().job_id(), message.suspend().generation());
      Enqueue(message);
      return;
    case v1::CoordinatorMessage::kStop:
      InterruptFor(message.stop().job_id(), message.stop().generation());
      Enqueue(message);
      return;
    default:
      Enqueue(message);
      return;
  }
}

void SimWorker::OnWelcome(uint64_t stream, const v1::Welcome& welcome) {
  welcomed_ = true;
  backoff_ = kBackoffInitial;
  if (welcome.coordinator_id() != coordinator_id_) {
    commanded_generation_.clear();
    last_warm_sequence_ = 0;
  }
  coordinator_id_ = welcome.coordinator_id();
  heartbeat_interval_ = absl::Milliseconds(welcome.heartbeat_interval_ms());
  heartbeat_timeout_ = absl::Milliseconds(welcome.heartbeat_timeout_ms());
  world_->Trace(absl::StrCat(id_, " welcomed on stream ", stream));
  // As WorkerAgent::HandleWelcome: a COMPLETED the last coordinator may not
  // have read is said again.
  if (held_.has_value() && held_state_ == v1::ASSIGNMENT_STATE_COMPLETED) {
    bool pending = false;
    for (const v1::AssignmentStatus& status : pending_statuses_) {
      pending |= status.job_id() == held_->job && status.generation() == held_->generation &&
                 status.state() == v1::ASSIGNMENT_STATE_COMPLETED;
    }
    if (!pending) {
      v1::AssignmentStatus status;
      status.set_job_id(held_->job);
      status.set_generation(held_->generation);
      status.set_state(v1::ASSIGNMENT_STATE_COMPLETED);
      *status.mutable_progress() = CurrentProgress();
      pending_statuses_.push_back(std::move(status));
    }
  }
  FlushStatuses();
  HeartbeatTick(stream);
}

void SimWorker::HeartbeatTick(uint64_t stream) {
  if (stream != stream_ || !welcomed_) return;
  const absl::Duration silent = world_->Now() - last_received_;
  if (silent > heartbeat_timeout_) {
    AbandonStream(absl::StrCat("nothing from the coordinator for ", absl::FormatDuration(silent),
                               " (heartbeat timeout ", absl::FormatDuration(heartbeat_timeout_),
                               ")"));
    return;
  }
  v1::WorkerMessage message;
  message.set_incarnation(incarnation_);
  v1::Heartbeat* heartbeat = message.mutable_heartbeat();
  heartbeat->set_sequence(heartbeat_sequence_++);
  if (held_.has_value()) {
    heartbeat->set_job_id(held_->job);
    heartbeat->set_generation(held_->generation);
    *heartbeat->mutable_progress() = CurrentProgress();
  }
  world_->SendOnStream(stream, message);
  world_->AtWorker(index_, incarnation_, heartbeat_interval_,
                   [this, stream] { HeartbeatTick(stream); });
}

v1::Progress SimWorker::CurrentProgress() const {
  v1::Progress progress;
  if (run_.has_value()) progress.set_step(run_->newest);
  if (held_.has_value() && held_->recovery.kind() != v1::RECOVERY_KIND_UNSPECIFIED &&
      (!run_.has_value() || run_->generation != held_->generation)) {
    progress.set_step(held_->recovery.step());  // restoring: the step it resumes at
  }
  progress.set_step_time_seconds(0.09);
  progress.set_waiting_for_peers(phase_ == Phase::kCollective);
  return progress;
}

void SimWorker::SendStatus(const std::string& job, uint64_t generation,
                           v1::AssignmentState state, const std::string& message,
                           const std::vector<v1::HeldState>& held) {
  v1::AssignmentStatus status;
  status.set_job_id(job);
  status.set_generation(generation);
  status.set_state(state);
  status.set_message(message);
  for (const v1::HeldState& h : held) *status.add_held_states() = h;
  *status.mutable_progress() = CurrentProgress();
  std::string held_text;
  for (const v1::HeldState& h : held) {
    absl::StrAppend(&held_text, held_text.empty() ? " holding" : ",", " g", h.generation(), "@",
                    h.step());
  }
  world_->Trace(absl::StrCat(id_, " -> ", StateName(state), " ", job, " g", generation, held_text,
                             message.empty() ? "" : " (" + message + ")"));
  if (pending_statuses_.size() >= kMaxPendingStatuses) pending_statuses_.pop_front();
  pending_statuses_.push_back(std::move(status));
  FlushStatuses();
}

void SimWorker::FlushStatuses() {
  if (stream_ == 0 || !welcomed_) return;  // goes out after the next Welcome
  while (!pending_statuses_.empty()) {
    v1::WorkerMessage message;
    message.set_incarnation(incarnation_);
    *message.mutable_status() = pending_statuses_.front();
    pending_statuses_.pop_front();
    world_->SendOnStream(stream_, message);
  }
}

// --- agent: commands ---

void SimWorker::Enqueue(const v1::CoordinatorMessage& command) {
  commands_.push_back(command);
  if (!busy_) RunNextCommand();
}

bool SimWorker::IsStale(const v1::CoordinatorMessage& command) {
  // As WorkerAgent::IsStale: older than a generation already commanded.
  const std::optional<CommandTarget> target = CommandTargetOf(command);
  if (!target.has_value()) return false;
  uint64_t& newest = commanded_generation_[target->job_id];
  if (target->generation < newest) return true;
  newest = target->generation;
  return false;
}

void SimWorker::RunNextCommand() {
  if (busy_ || commands_.empty()) return;
  v1::CoordinatorMessage command = std::move(commands_.front());
  commands_.pop_front();
  if (IsStale(command)) {
    RunNextCommand();
    return;
  }
  busy_ = true;
  switch (command.kind_case()) {
    case v1::CoordinatorMessage::kAssign:
      ExecuteAssign(command.assign());
      return;  // PrepareAndReport calls CommandDone
    case v1::CoordinatorMessage::kReconfigure:
      ExecuteReconfigure(command.reconfigure());
      return;
    case v1::CoordinatorMessage::kStop:
      ExecuteStop(command.stop());
      break;
    case v1::CoordinatorMessage::kSuspend:
      ExecuteSuspend(command.suspend());
      break;
    case v1::CoordinatorMessage::kWarmUp:
      ExecuteWarmUp(command.warm_up());
      break;
    default:
      break;
  }
  CommandDone();
}

void SimWorker::ExecuteWarmUp(const v1::WarmUp& warm) {
  // As WorkerAgent::ExecuteWarmUp: an older one (two calls' messages
  // crossed) or one naming a job while this worker holds an assignment is
  // ignored.
  if (warm.sequence() <= last_warm_sequence_) return;
  last_warm_sequence_ = warm.sequence();
  if (!warm.job_id().empty() && held_.has_value() &&
      held_state_ != v1::ASSIGNMENT_STATE_COMPLETED) {
    world_->Trace(absl::StrCat(id_, " ignores a WarmUp of ", warm.job_id(), ": it holds ",
                               held_->job));
    return;
  }
  warm_job_ = warm.job_id();
  world_->Trace(absl::StrCat(id_, warm_job_.empty() ? " releases its warm session"
                                                    : " warms up for " + warm_job_,
                             warm_job_.empty() ? "" : absl::StrCat(" g", warm.generation(),
                                                                    " rank ",
                                                                    warm.coordinates().rank())));
}

void SimWorker::CommandDone() {
  busy_ = false;
  // The command thread picks up the next one right away.
  world_->AtWorker(index_, incarnation_, absl::ZeroDuration(), [this] { RunNextCommand(); });
}

void SimWorker::ActingOn(const std::string& job, uint64_t generation, const char* what) {
  uint64_t& newest = newest_command_generation_[job];
  if (generation < newest) {
    world_->Violation(absl::StrCat(id_, " acted on a stale ", what, " of ", job, " generation ",
                                   generation, " after executing a command of generation ",
                                   newest));
  }
  newest = std::max(newest, generation);
}

void SimWorker::ExecuteAssign(const v1::Assign& assign) {
  warm_job_.clear();  // WarmSpare::Take: taken or released
  if (held_.has_value() && held_->job == assign.job_id()) {
    if (assign.generation() < held_->generation) {
      CommandDone();
      return;  // stale
    }
    if (assign.generation() == held_->generation) {
      SendStatus(assign.job_id(), assign.generation(), held_state_, "");
      CommandDone();
      return;
    }
  } else if (held_.has_value()) {
    TrainerStop();  // an Assign of another job replaces the held one
  }
  ActingOn(assign.job_id(), assign.generation(), "Assign");
  Assignment a;
  a.job = assign.job_id();
  a.generation = assign.generation();
  a.spec = assign.spec();
  a.mesh = assign.mesh();
  a.coordinates = assign.coordinates();
  a.recovery = assign.recovery();
  a.participant = assign.coordinates().rank();
  world_->Trace(absl::StrCat(id_, " assigned ", a.job, " g", a.generation, " rank ",
                             a.coordinates.rank(), " (", v1::RecoveryKind_Name(a.recovery.kind()),
                             " at step ", a.recovery.step(), ")"));
  PrepareAndReport(std::move(a));
}

void SimWorker::ExecuteReconfigure(const v1::Reconfigure& reconfigure) {
  const std::string& job = reconfigure.job_id();
  const uint64_t generation = reconfigure.generation();
  if (!held_.has_value() || held_->job != job) {
    if (reconfigure.role() != v1::RECONFIGURE_ROLE_DONOR && reconfigure.has_spec()) {
      // As WorkerAgent: the Assign was overtaken; join from the Reconfigure.
      v1::Assign assign;
      assign.set_job_id(job);
      assign.set_generation(generation);
      *assign.mutable_spec() = reconfigure.spec();
      *assign.mutable_mesh() = reconfigure.mesh();
      *assign.mutable_coordinates() = reconfigure.coordinates();
      *assign.mutable_recovery() = reconfigure.recovery();
      ExecuteAssign(assign);
      return;
    }
    SendStatus(job, generation, v1::ASSIGNMENT_STATE_FAILED,
               absl::StrCat("worker ", id_, " does not hold job ", job, "; it needs an Assign"));
    CommandDone();
    return;
  }
  if (generation < held_->generation) {
    CommandDone();
    return;  // stale
  }
  if (generation == held_->generation) {
    std::vector<v1::HeldState> held;
    if (held_state_ == v1::ASSIGNMENT_STATE_SUSPENDED) held = TrainerSuspend();
    SendStatus(job, generation, held_state_, "", held);
    CommandDone();
    return;
  }
  ActingOn(job, generation, "Reconfigure");
  Assignment next = *held_;
  next.generation = generation;
  next.mesh = reconfigure.mesh();
  next.coordinates = reconfigure.coordinates();
  next.recovery = reconfigure.recovery();
  next.donor = reconfigure.role() == v1::RECONFIGURE_ROLE_DONOR;
  next.participant = reconfigure.coordinates().rank();
  world_->Trace(absl::StrCat(id_, " reconfigured ", job, " g", held_->generation, " -> g",
                             generation, next.donor ? " as donor" : "", " (",
                             v1::RecoveryKind_Name(next.recovery.kind()), " at step ",
                             next.recovery.step(), ")"));
  if (next.donor) {
    next.participant = -1;
    for (int i = 0; i < reconfigure.recovery().donors_size(); ++i) {
      if (reconfigure.recovery().donors(i).worker_id() == id_) {
        next.participant = reconfigure.mesh().members_size() + i;
      }
    }
    ExecuteDonate(std::move(next));
    return;
  }
  PrepareAndReport(std::move(next));
}

void SimWorker::ExecuteStop(const v1::Stop& stop) {
  const bool holds = held_.has_value() && held_->job == stop.job_id();
  if (holds && stop.generation() < held_->generation) return;  // stale
  if (holds) {
    ActingOn(stop.job_id(), stop.generation(), "Stop");
    world_->Trace(absl::StrCat(id_, " stops ", stop.job_id(), " g", stop.generation(), ": ",
                               stop.reason()));
    TrainerStop();
    held_.reset();
    held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  }
  SendStatus(stop.job_id(), stop.generation(), v1::ASSIGNMENT_STATE_RELEASED, "");
}

void SimWorker::InterruptFor(const std::string& job, uint64_t generation) {
  // As WorkerAgent::InterruptFor: not filtered by what is held (the message
  // may overtake the Prepare it interrupts); the trainer keeps it.
  TrainerInterrupt(job, generation);
}

void SimWorker::ExecuteSuspend(const v1::Suspend& suspend) {
  const std::string& job = suspend.job_id();
  if (held_.has_value() && held_->job == job && suspend.generation() < held_->generation) {
    return;  // stale
  }
  if (held_.has_value() && held_->job == job) ActingOn(job, suspend.generation(), "Suspend");
  const std::vector<v1::HeldState> held = TrainerSuspend();
  if (held_.has_value() && held_->job == job) held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
  SendStatus(job, suspend.generation(), v1::ASSIGNMENT_STATE_SUSPENDED, suspend.reason(), held);
}

void SimWorker::ExecuteDonate(Assignment assignment) {
  const std::string job = assignment.job;
  const uint64_t generation = assignment.generation;
  auto finish = [this, job, generation](absl::Status donated) {
    if (donated.ok()) {
      held_.reset();
      held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
    } else {
      held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;  // the source state is kept
    }
    SendStatus(job, generation, v1::ASSIGNMENT_STATE_DONATED,
               donated.ok() ? "" : donated.ToString());
    CommandDone();
  };
  held_ = assignment;  // as WorkerAgent::ExecuteDonate: older commands are stale now
  held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  if (assignment.participant < 0) {
    finish(absl::InvalidArgumentError("not among the plan's donors"));
    return;
  }
  TrainerDonate(assignment, std::move(finish));
}

void SimWorker::PrepareAndReport(Assignment assignment) {
  const std::string job = assignment.job;
  const uint64_t generation = assignment.generation;
  held_ = assignment;
  held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  TrainerPrepare(assignment, [this, job, generation](absl::Status prepared) {
    if (prepared.ok()) {
      if (held_.has_value() && held_->job == job && held_->generation == generation) {
        held_state_ = v1::ASSIGNMENT_STATE_READY;
      }
      SendStatus(job, generation, v1::ASSIGNMENT_STATE_READY, "");
    } else if (Retriable(prepared)) {
      const std::vector<v1::HeldState> held = TrainerSuspend();
      if (held_.has_value() && held_->job == job) held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
      SendStatus(job, generation, v1::ASSIGNMENT_STATE_SUSPENDED, prepared.ToString(), held);
    } else {
      TrainerStop();
      held_.reset();
      held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
      SendStatus(job, generation, v1::ASSIGNMENT_STATE_FAILED, prepared.ToString());
    }
    CommandDone();
  });
}

void SimWorker::ReportSuspended(const std::string& job, uint64_t generation,
                                const std::string& reason) {
  if (!held_.has_value() || held_->job != job || held_->generation != generation) return;
  held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
  std::vector<v1::HeldState> held;
  if (run_.has_value() && run_->generation == generation) {
    v1::HeldState state;
    state.set_generation(generation);
    state.set_step(run_->newest);
    held.push_back(state);
    // The source generation, kept until this one trains (EngineTrainer's
    // Run::kept).
    if (!run_->trained && previous_.has_value()) {
      state.set_generation(previous_->generation);
      state.set_step(previous_->newest);
      held.push_back(state);
    }
  }
  SendStatus(job, generation, v1::ASSIGNMENT_STATE_SUSPENDED, reason, held);
}

void SimWorker::ReportTrainingFinished(const std::string& job, uint64_t generation) {
  if (!held_.has_value() || held_->job != job || held_->generation != generation) return;
  held_state_ = v1::ASSIGNMENT_STATE_COMPLETED;
  SendStatus(job, generation, v1::ASSIGNMENT_STATE_COMPLETED, "");
}

std::vector<v1::HeldState> SimWorker::HeldStates(const std::string& job) const {
  std::vector<v1::HeldState> held;
  if (!alive_) return held;
  for (const std::optional<Run>* run : {&run_, &previous_}) {
    if (!run->has_value() || (*run)->job != job) continue;
    v1::HeldState state;
    state.set_generation((*run)->generation);
    state.set_step((*run)->newest);
    held.push_back(state);
  }
  return held;
}

}  // namespace cohort::simulation
