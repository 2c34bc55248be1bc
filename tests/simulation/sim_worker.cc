#include "tests/simulation/sim_worker.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/simulation/sim_world.h"

namespace cohort::simulation {
namespace {

// WorkerAgentOptions' and BackoffOptions' defaults, on the simulator's clock.
constexpr absl::Duration kBackoffInitial = absl::Milliseconds(100);
constexpr absl::Duration kBackoffMax = absl::Seconds(5);
constexpr absl::Duration kBackoffMaxHolding = absl::Seconds(1);
constexpr absl::Duration kWelcomeTimeout = absl::Seconds(5);

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
  busy_ = false;
  protocol_.emplace(id_);
  newest_command_generation_.clear();
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
  if (std::optional<v1::HeldAssignment> held = protocol_->HeldForHello()) {
    *hello->mutable_held() = std::move(*held);
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
  // As worker::Backoff: doubling from 100 ms, capped lower while holding.
  const absl::Duration cap = protocol_->held().has_value() ? kBackoffMaxHolding : kBackoffMax;
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
    default:
      // As WorkerAgent's reader thread: a Suspend or Stop interrupts the
      // Prepare it is meant for at once; then the command queues.
      if (std::optional<CommandTarget> target = worker::InterruptTargetOf(message)) {
        TrainerInterrupt(target->job_id, target->generation);
      }
      protocol_->Receive(message);
      if (!busy_) RunNextCommand();
      return;
  }
}

void SimWorker::OnWelcome(uint64_t stream, const v1::Welcome& welcome) {
  welcomed_ = true;
  backoff_ = kBackoffInitial;
  heartbeat_interval_ = absl::Milliseconds(welcome.heartbeat_interval_ms());
  heartbeat_timeout_ = absl::Milliseconds(welcome.heartbeat_timeout_ms());
  world_->Trace(absl::StrCat(id_, " welcomed on stream ", stream));
  protocol_->OnWelcome(welcome, CurrentProgress());
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
  if (const std::optional<worker::Assignment>& held = protocol_->held()) {
    heartbeat->set_job_id(held->job_id.value());
    heartbeat->set_generation(held->generation.value());
    *heartbeat->mutable_progress() = CurrentProgress();
  }
  world_->SendOnStream(stream, message);
  world_->AtWorker(index_, incarnation_, heartbeat_interval_,
                   [this, stream] { HeartbeatTick(stream); });
}

v1::Progress SimWorker::CurrentProgress() const {
  v1::Progress progress;
  if (run_.has_value()) progress.set_step(run_->newest);
  const std::optional<worker::Assignment>& held = protocol_->held();
  if (held.has_value() && held->recovery.kind() != v1::RECOVERY_KIND_UNSPECIFIED &&
      (!run_.has_value() || run_->generation != held->generation.value())) {
    progress.set_step(held->recovery.step());  // restoring: the step it resumes at
  }
  progress.set_step_time_seconds(0.09);
  progress.set_waiting_for_peers(phase_ == Phase::kCollective);
  return progress;
}

void SimWorker::SendStatus(v1::AssignmentStatus status) {
  *status.mutable_progress() = CurrentProgress();
  std::string held_text;
  for (const v1::HeldState& h : status.held_states()) {
    absl::StrAppend(&held_text, held_text.empty() ? " holding" : ",", " g", h.generation(), "@",
                    h.step());
  }
  world_->Trace(absl::StrCat(id_, " -> ", StateName(status.state()), " ", status.job_id(), " g",
                             status.generation(), held_text,
                             status.message().empty() ? "" : " (" + status.message() + ")"));
  protocol_->Say(std::move(status));
  FlushStatuses();
}

void SimWorker::FlushStatuses() {
  if (stream_ == 0 || !welcomed_) return;  // goes out after the next Welcome
  while (const v1::AssignmentStatus* next = protocol_->NextPending()) {
    v1::WorkerMessage message;
    message.set_incarnation(incarnation_);
    *message.mutable_status() = *next;
    protocol_->PopPending();
    world_->SendOnStream(stream_, message);
  }
}

// --- agent: commands ---

void SimWorker::RunNextCommand() {
  if (busy_) return;
  std::optional<v1::CoordinatorMessage> command = protocol_->NextCommand();
  if (!command.has_value()) return;
  busy_ = true;
  Execute(*command);
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

void SimWorker::Execute(const v1::CoordinatorMessage& command) {
  const std::optional<worker::Assignment> before = protocol_->held();
  worker::CommandDecision decision = protocol_->Decide(command);
  using Kind = worker::CommandDecision::Kind;
  switch (decision.kind) {
    case Kind::kNothing:
      if (command.has_warm_up() && !decision.why.empty()) {
        world_->Trace(absl::StrCat(id_, " ignores ", decision.why));
      }
      break;
    case Kind::kSay:
      SendStatus(std::move(decision.status));
      break;
    case Kind::kSayHeldStates:
      for (const v1::HeldState& h : TrainerSuspend()) *decision.status.add_held_states() = h;
      SendStatus(std::move(decision.status));
      break;
    case Kind::kPrepare:
      if (decision.stop_first) TrainerStop();  // an Assign of another job replaces the held one
      TraceCommand(command, before, decision);
      PrepareAndReport(decision.assignment);
      return;  // CommandDone when prepared
    case Kind::kDonate:
      TraceCommand(command, before, decision);
      DonateAndReport(decision.assignment, decision.donate_refused);
      return;  // CommandDone when donated
    case Kind::kSuspend: {
      const std::optional<worker::Assignment>& held = protocol_->held();
      if (held.has_value() && held->job_id.value() == command.suspend().job_id()) {
        ActingOn(command.suspend().job_id(), command.suspend().generation(), "Suspend");
      }
      const std::vector<v1::HeldState> kept = TrainerSuspend();
      SendStatus(protocol_->FinishSuspend(command.suspend(), kept));
      break;
    }
    case Kind::kStop: {
      const v1::Stop& stop = command.stop();
      if (decision.stop_trainer) {
        ActingOn(stop.job_id(), stop.generation(), "Stop");
        world_->Trace(absl::StrCat(id_, " stops ", stop.job_id(), " g", stop.generation(), ": ",
                                   stop.reason()));
        TrainerStop();
      }
      SendStatus(protocol_->FinishStop(stop));
      break;
    }
    case Kind::kWarm: {
      const worker::Assignment& slot = decision.assignment;
      world_->Trace(absl::StrCat(
          id_,
          slot.job_id.value().empty() ? " releases its warm session"
                                      : " warms up for " + slot.job_id.value(),
          slot.job_id.value().empty()
              ? ""
              : absl::StrCat(" g", slot.generation.value(), " rank ", slot.coordinates.rank())));
      break;
    }
    case Kind::kDrain:
      TrainerStop();
      if (std::optional<v1::AssignmentStatus> released =
              protocol_->FinishDrain(command.drain())) {
        SendStatus(std::move(*released));
      }
      break;
  }
  CommandDone();
}

void SimWorker::TraceCommand(const v1::CoordinatorMessage& command,
                             const std::optional<worker::Assignment>& before,
                             const worker::CommandDecision& decision) {
  const worker::Assignment& a = decision.assignment;
  const std::string& job = a.job_id.value();
  const bool reconfigures =
      command.has_reconfigure() && before.has_value() && before->job_id == a.job_id;
  ActingOn(job, a.generation.value(), reconfigures ? "Reconfigure" : "Assign");
  if (reconfigures) {
    world_->Trace(absl::StrCat(id_, " reconfigured ", job, " g", before->generation.value(),
                               " -> g", a.generation.value(), a.donor ? " as donor" : "", " (",
                               v1::RecoveryKind_Name(a.recovery.kind()), " at step ",
                               a.recovery.step(), ")"));
    return;
  }
  world_->Trace(absl::StrCat(id_, " assigned ", job, " g", a.generation.value(), " rank ",
                             a.coordinates.rank(), " (", v1::RecoveryKind_Name(a.recovery.kind()),
                             " at step ", a.recovery.step(), ")"));
}

SimWorker::Assignment SimWorker::TrainerAssignment(const worker::Assignment& assignment) {
  Assignment a;
  a.job = assignment.job_id.value();
  a.generation = assignment.generation.value();
  a.spec = assignment.spec;
  a.mesh = assignment.mesh;
  a.coordinates = assignment.coordinates;
  a.recovery = assignment.recovery;
  a.donor = assignment.donor;
  a.participant = assignment.participant;
  return a;
}

void SimWorker::PrepareAndReport(const worker::Assignment& assignment) {
  protocol_->Hold(assignment);
  TrainerPrepare(TrainerAssignment(assignment), [this, assignment](absl::Status prepared) {
    std::vector<v1::HeldState> kept;
    switch (worker::PrepareOutcomeOf(prepared)) {
      case worker::PrepareOutcome::kReady:
        break;
      case worker::PrepareOutcome::kCutShort:
        kept = TrainerSuspend();
        break;
      case worker::PrepareOutcome::kFailed:
        TrainerStop();
        break;
    }
    SendStatus(protocol_->FinishPrepare(assignment, prepared, kept, {}));
    CommandDone();
  });
}

void SimWorker::DonateAndReport(const worker::Assignment& assignment,
                                const absl::Status& refused) {
  // Held while donating: older commands are stale now.
  protocol_->Hold(assignment);
  auto finish = [this, assignment](absl::Status donated) {
    SendStatus(protocol_->FinishDonate(assignment, donated));
    CommandDone();
  };
  if (!refused.ok()) {
    finish(refused);
    return;
  }
  TrainerDonate(TrainerAssignment(assignment), std::move(finish));
}

void SimWorker::ReportSuspended(const std::string& job, uint64_t generation,
                                const absl::Status& why) {
  std::vector<v1::HeldState> kept;
  if (run_.has_value() && run_->generation == generation) {
    v1::HeldState state;
    state.set_generation(generation);
    state.set_step(run_->newest);
    kept.push_back(state);
    // The source generation, kept until this one trains (EngineTrainer's
    // Run::kept).
    if (!run_->trained && previous_.has_value()) {
      state.set_generation(previous_->generation);
      state.set_step(previous_->newest);
      kept.push_back(state);
    }
  }
  if (std::optional<v1::AssignmentStatus> status =
          protocol_->TrainingSuspended(JobId(job), Generation(generation), kept, why)) {
    SendStatus(std::move(*status));
  }
}

void SimWorker::ReportTrainingFinished(const std::string& job, uint64_t generation) {
  if (std::optional<v1::AssignmentStatus> status =
          protocol_->TrainingFinished(JobId(job), Generation(generation), absl::OkStatus())) {
    SendStatus(std::move(*status));
  }
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
