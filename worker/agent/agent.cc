#include "worker/agent/agent.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::worker {

WorkerAgent::WorkerAgent(std::unique_ptr<v1::Workers::StubInterface> stub, Trainer* trainer,
                         const Clock* clock, std::shared_ptr<prometheus::Registry> registry,
                         WorkerAgentOptions options)
    : stub_(std::move(stub)),
      trainer_(trainer),
      clock_(clock),
      metrics_(std::move(registry)),
      options_(std::move(options)),
      protocol_(options_.identity.worker_id) {
  CHECK(options_.incarnation.value() != 0) << "incarnation must be non-zero";
}

WorkerAgent::~WorkerAgent() = default;

void WorkerAgent::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (!shutdown_requested_) LOG(INFO) << "shutdown requested";
  shutdown_requested_ = true;
  cv_.SignalAll();
}

std::optional<Assignment> WorkerAgent::held() const {
  absl::MutexLock lock(&mu_);
  return protocol_.held();
}

bool WorkerAgent::WaitSliceLocked(absl::Time deadline) {
  const absl::Duration left = deadline - clock_->Now();
  if (left <= absl::ZeroDuration()) return false;
  cv_.WaitWithTimeout(&mu_, std::min(left, kClockSlice));
  return true;
}

absl::Status WorkerAgent::Run() {
  {
    absl::MutexLock lock(&mu_);
    if (running_) return absl::FailedPreconditionError("WorkerAgent::Run called twice");
    running_ = true;
  }
  std::thread command_thread([this] { CommandLoop(); });
  Backoff backoff(options_.backoff);
  int failed_attempts = 0;  // since the last Welcome
  bool first_attempt = true;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (StoppingLocked()) break;
    }
    if (!first_attempt) metrics_.reconnects.Increment();
    first_attempt = false;
    const SessionResult result = RunSession();
    if (result.welcomed) {
      backoff.Reset();
      failed_attempts = 0;
    }
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      const absl::Duration delay = backoff.Next(/*holding=*/protocol_.held().has_value());
      if (StoppingLocked()) break;
      LogReconnectLocked(delay, ++failed_attempts, result.status);
      deadline = clock_->Now() + delay;
      if (!options_.wait_for_coordinator) {
        while (!StoppingLocked() && WaitSliceLocked(deadline)) {
        }
        continue;
      }
    }
    WaitForCoordinator(deadline);
  }
  {
    absl::MutexLock lock(&mu_);
    command_thread_exit_ = true;
    cv_.SignalAll();
  }
  // Stop before joining so a Prepare in flight gives up; again after, in case
  // the command thread started one in between.
  trainer_->Stop();
  command_thread.join();
  trainer_->Stop();
  absl::MutexLock lock(&mu_);
  LOG(INFO) << (drain_requested_ ? "drained; leaving" : "shut down; leaving");
  return absl::OkStatus();
}

void WorkerAgent::WaitForCoordinator(absl::Time deadline) {
  constexpr absl::Duration kSlice = absl::Milliseconds(100);
  if (options_.wait_for_coordinator(clock_->Now())) {
    // Connected already: the coordinator was reached and the attach failed
    // for another reason (refused, no Welcome). Retrying at once would spin
    // against it; the backoff delay is waited out.
    absl::MutexLock lock(&mu_);
    while (!StoppingLocked() && WaitSliceLocked(deadline)) {
    }
    return;
  }
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (StoppingLocked()) return;
    }
    const absl::Time now = clock_->Now();
    if (now >= deadline) return;
    if (options_.wait_for_coordinator(std::min(deadline, now + kSlice))) return;
  }
}

void WorkerAgent::CommandLoop() {
  while (true) {
    std::optional<v1::CoordinatorMessage> command;
    {
      absl::MutexLock lock(&mu_);
      while (!protocol_.HasCommand() && !command_thread_exit_) cv_.Wait(&mu_);
      if (command_thread_exit_) return;
      command = protocol_.NextCommand();  // nullopt: all that was queued was stale
    }
    if (command.has_value() && !Execute(*command)) return;  // nothing after a Drain
  }
}

bool WorkerAgent::Execute(const v1::CoordinatorMessage& command) {
  CommandDecision decision;
  {
    absl::MutexLock lock(&mu_);
    decision = protocol_.Decide(command);
  }
  using Kind = CommandDecision::Kind;
  switch (decision.kind) {
    case Kind::kNothing:
      return true;
    case Kind::kSay:
      SendStatus(std::move(decision.status));
      return true;
    case Kind::kSayHeldStates:
      for (const v1::HeldState& h : trainer_->Suspend()) *decision.status.add_held_states() = h;
      SendStatus(std::move(decision.status));
      return true;
    case Kind::kPrepare:
      if (decision.stop_first) trainer_->Stop();
      PrepareAndReport(decision.assignment);
      return true;
    case Kind::kDonate:
      DonateAndReport(decision.assignment, decision.donate_refused);
      return true;
    case Kind::kSuspend: {
      const std::vector<v1::HeldState> kept = trainer_->Suspend();
      v1::AssignmentStatus status;
      {
        absl::MutexLock lock(&mu_);
        status = protocol_.FinishSuspend(command.suspend(), kept);
      }
      SendStatus(std::move(status));
      return true;
    }
    case Kind::kStop: {
      if (decision.stop_trainer) trainer_->Stop();
      v1::AssignmentStatus status;
      {
        absl::MutexLock lock(&mu_);
        status = protocol_.FinishStop(command.stop());
      }
      metrics_.assignment_generation.Set(0);
      SendStatus(std::move(status));
      return true;
    }
    case Kind::kWarm:
      trainer_->Warm(decision.assignment);
      return true;
    case Kind::kDrain: {
      trainer_->Stop();
      std::optional<v1::AssignmentStatus> released;
      {
        absl::MutexLock lock(&mu_);
        released = protocol_.FinishDrain(command.drain());
      }
      metrics_.assignment_generation.Set(0);
      if (released.has_value()) SendStatus(std::move(*released));
      // Set after the status is written, so the half-close follows it.
      absl::MutexLock lock(&mu_);
      drain_requested_ = true;
      cv_.SignalAll();
      return false;
    }
  }
  return true;
}

void WorkerAgent::PrepareAndReport(const Assignment& assignment) {
  {
    absl::MutexLock lock(&mu_);
    protocol_.Hold(assignment);
  }
  metrics_.assignment_generation.Set(static_cast<double>(assignment.generation.value()));
  const absl::Status prepared = trainer_->Prepare(assignment);
  std::vector<v1::HeldState> kept;
  v1::PreparePhases phases;
  switch (PrepareOutcomeOf(prepared)) {
    case PrepareOutcome::kReady:
      phases = trainer_->last_prepare();
      break;
    case PrepareOutcome::kCutShort:
      kept = trainer_->Suspend();
      break;
    case PrepareOutcome::kFailed:
      trainer_->Stop();
      metrics_.assignment_generation.Set(0);
      break;
  }
  v1::AssignmentStatus status;
  {
    absl::MutexLock lock(&mu_);
    status = protocol_.FinishPrepare(assignment, prepared, kept, phases);
  }
  SendStatus(std::move(status));
}

void WorkerAgent::DonateAndReport(const Assignment& assignment, const absl::Status& refused) {
  {
    // Held while donating: a Suspend or Stop of the generation it donates
    // from, delivered late, is stale and must not interrupt the donation.
    absl::MutexLock lock(&mu_);
    protocol_.Hold(assignment);
  }
  const absl::Status donated = refused.ok() ? trainer_->Donate(assignment) : refused;
  v1::AssignmentStatus status;
  {
    absl::MutexLock lock(&mu_);
    status = protocol_.FinishDonate(assignment, donated);
  }
  if (donated.ok()) metrics_.assignment_generation.Set(0);
  SendStatus(std::move(status));
}

void WorkerAgent::ReportSuspended(const JobId& job, Generation generation,
                                  const std::vector<v1::HeldState>& held,
                                  const absl::Status& why) {
  std::optional<v1::AssignmentStatus> status;
  {
    absl::MutexLock lock(&mu_);
    status = protocol_.TrainingSuspended(job, generation, held, why);
  }
  if (status.has_value()) SendStatus(std::move(*status));
}

void WorkerAgent::ReportTrainingFinished(const JobId& job, Generation generation,
                                         const absl::Status& status) {
  std::optional<v1::AssignmentStatus> report;
  {
    absl::MutexLock lock(&mu_);
    report = protocol_.TrainingFinished(job, generation, status);
  }
  if (report.has_value()) SendStatus(std::move(*report));
}

void WorkerAgent::SendStatus(v1::AssignmentStatus status) {
  *status.mutable_progress() = ProgressProto(trainer_->progress());  // not under mu_
  const std::string job = status.job_id();
  const uint64_t generation = status.generation();
  std::shared_ptr<AttachStream> stream;
  {
    absl::MutexLock lock(&mu_);
    protocol_.Say(std::move(status));
    stream = welcomed_stream_;
  }
  if (stream == nullptr) {
    LOG(INFO) << "coordinator away; the status of job " << job << " generation " << generation
              << " goes out after the next attach";
    return;
  }
  FlushPendingStatuses(stream);
}

void WorkerAgent::FlushPendingStatuses(const std::shared_ptr<AttachStream>& stream) {
  // One flusher at a time, so a status is neither reordered nor sent twice.
  absl::MutexLock flush_lock(&flush_mu_);
  while (true) {
    v1::WorkerMessage message = NewMessage();
    {
      absl::MutexLock lock(&mu_);
      const v1::AssignmentStatus* next = protocol_.NextPending();
      if (next == nullptr) return;
      *message.mutable_status() = *next;
    }
    if (!stream->Write(message)) return;  // kept for the next stream
    absl::MutexLock lock(&mu_);
    protocol_.PopPending();
  }
}

v1::Progress WorkerAgent::ProgressProto(const TrainingProgress& progress) {
  v1::Progress proto;
  proto.set_step(progress.step.value());
  if (progress.loss.has_value()) proto.set_loss(*progress.loss);
  proto.set_tokens_per_second(progress.tokens_per_second);
  proto.set_tokens_per_second_average(progress.tokens_per_second_average);
  proto.set_step_time_seconds(progress.step_time_seconds);
  proto.set_waiting_for_peers(progress.waiting_for_peers);
  for (const ValidationPoint& point : progress.recent_validations) {
    v1::LossPoint* p = proto.add_validation();
    p->set_step(point.step.value());
    p->set_loss(point.loss);
  }
  return proto;
}

v1::WorkerMessage WorkerAgent::NewMessage() const {
  v1::WorkerMessage message;
  message.set_incarnation(options_.incarnation.value());
  return message;
}

void WorkerAgent::LogReconnectLocked(absl::Duration delay, int attempt,
                                     const absl::Status& last_error) {
  const absl::Time now = clock_->Now();
  if (now - last_reconnect_log_ < options_.reconnect_log_interval) {
    ++suppressed_reconnect_logs_;
    return;
  }
  const std::string suppressed =
      suppressed_reconnect_logs_ > 0
          ? absl::StrCat(" (", suppressed_reconnect_logs_, " similar lines suppressed)")
          : std::string();
  // Unavailable is the coordinator being away; anything else (AlreadyExists,
  // InvalidArgument, ...) is a refusal an operator may need to see.
  if (absl::IsUnavailable(last_error) || absl::IsCancelled(last_error) ||
      absl::IsDeadlineExceeded(last_error)) {
    LOG(INFO) << "coordinator unreachable (" << last_error << "); re-attach attempt " << attempt
              << " in " << delay << suppressed;
  } else {
    LOG(WARNING) << "coordinator refused the attach (" << last_error << "); retry " << attempt
                 << " in " << delay << suppressed;
  }
  last_reconnect_log_ = now;
  suppressed_reconnect_logs_ = 0;
}

}  // namespace cohort::worker
