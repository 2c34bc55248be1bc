#include "worker/agent/agent.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/command_target.h"
#include "common/layout/mesh_proto.h"
#include "common/log.h"
#include "common/process_info.h"
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

v1::Progress ToProto(const TrainingProgress& progress) {
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

}  // namespace

WorkerAgent::WorkerAgent(std::unique_ptr<v1::Workers::StubInterface> stub, Trainer* trainer,
                         const Clock* clock, std::shared_ptr<prometheus::Registry> registry,
                         WorkerAgentOptions options)
    : stub_(std::move(stub)),
      trainer_(trainer),
      clock_(clock),
      metrics_(std::move(registry)),
      options_(std::move(options)) {
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
  return held_;
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
      const absl::Duration delay = backoff.Next(/*holding=*/held_.has_value());
      if (StoppingLocked()) break;
      LogReconnectLocked(delay, ++failed_attempts, result.status);
      deadline = absl::Now() + delay;
      if (!options_.wait_for_coordinator) {
        while (!StoppingLocked() && !cv_.WaitWithDeadline(&mu_, deadline)) {
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
  if (options_.wait_for_coordinator(absl::Now())) {
    // Connected already: the coordinator was reached and the attach failed
    // for another reason (refused, no Welcome). Retrying at once would spin
    // against it; the backoff delay is waited out.
    absl::MutexLock lock(&mu_);
    while (!StoppingLocked() && !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
    return;
  }
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (StoppingLocked()) return;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return;
    if (options_.wait_for_coordinator(std::min(deadline, now + kSlice))) return;
  }
}

WorkerAgent::SessionResult WorkerAgent::RunSession() {
  auto stream = std::make_shared<AttachStream>(stub_.get());
  v1::WorkerMessage hello_message = NewMessage();
  v1::Hello* hello = hello_message.mutable_hello();
  const WorkerIdentity& id = options_.identity;
  hello->set_worker_id(id.worker_id);
  hello->set_host(id.host);
  hello->set_device_kind(id.device_kind);
  hello->set_device_index(id.device_index);
  *hello->mutable_capabilities() = id.capabilities;
  hello->set_incarnation(options_.incarnation.value());
  hello->set_metrics_address(id.metrics_address);
  {
    absl::MutexLock lock(&mu_);
    session_ended_ = false;
    session_welcome_.reset();
    last_received_ = clock_->Now();
    if (held_.has_value()) {
      v1::HeldAssignment* held = hello->mutable_held();
      held->set_job_id(held_->job_id.value());
      held->set_generation(held_->generation.value());
      *held->mutable_coordinates() = held_->coordinates;
    }
  }
  LOG(DEBUG) << "attaching: " << hello->ShortDebugString();
  // A failed write means the stream is already broken; the reader sees that.
  stream->Write(hello_message);
  std::thread reader([this, stream] { ReadLoop(stream); });

  std::optional<v1::Welcome> welcome;
  bool ended = false;
  bool stopping = false;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + options_.welcome_timeout;
    while (!session_ended_ && !session_welcome_.has_value() && !StoppingLocked() &&
           !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
    welcome = session_welcome_;
  }
  if (welcome.has_value()) {
    const absl::Duration interval = welcome->heartbeat_interval_ms() > 0
                                        ? absl::Milliseconds(welcome->heartbeat_interval_ms())
                                        : options_.default_heartbeat_interval;
    const absl::Duration timeout = welcome->heartbeat_timeout_ms() > 0
                                       ? absl::Milliseconds(welcome->heartbeat_timeout_ms())
                                       : absl::InfiniteDuration();
    HeartbeatLoop(stream, interval, timeout);
  }
  {
    absl::MutexLock lock(&mu_);
    ended = session_ended_;
    stopping = StoppingLocked();
  }
  if (!ended) {
    if (stopping) {
      CloseStream(stream);
    } else {
      if (!welcome.has_value()) {
        LOG(WARNING) << "no Welcome from the coordinator within " << options_.welcome_timeout
                     << "; abandoning this stream";
      }
      stream->Cancel();
    }
  }
  reader.join();
  SessionResult result{welcome.has_value(), stream->Finish()};
  {
    absl::MutexLock lock(&mu_);
    if (welcomed_stream_ == stream) welcomed_stream_.reset();
    heartbeat_sent_at_.clear();
    stopping = StoppingLocked();
  }
  metrics_.attached.Set(0);
  if (welcome.has_value() && !stopping) {
    LOG(WARNING) << "stream to coordinator " << welcome->coordinator_id()
                 << " ended: " << result.status << "; keeping the assignment and re-attaching";
  }
  if (result.status.ok() && !stopping) {
    // The coordinator closed the stream without a Drain: still a reason to
    // come back, but it is not an error to report.
    result.status = absl::UnavailableError("coordinator closed the stream");
  }
  return result;
}

void WorkerAgent::ReadLoop(std::shared_ptr<AttachStream> stream) {
  v1::CoordinatorMessage message;
  while (stream->Read(&message)) {
    {
      absl::MutexLock lock(&mu_);
      last_received_ = clock_->Now();
    }
    switch (message.kind_case()) {
      case v1::CoordinatorMessage::kWelcome:
        HandleWelcome(stream, message.welcome());
        break;
      case v1::CoordinatorMessage::kHeartbeatAck:
        HandleAck(message.heartbeat_ack());
        break;
      case v1::CoordinatorMessage::kSuspend:
        InterruptFor(message.suspend().job_id(), message.suspend().generation());
        [[fallthrough]];
      case v1::CoordinatorMessage::kAssign:
      case v1::CoordinatorMessage::kReconfigure:
      case v1::CoordinatorMessage::kStop:
      case v1::CoordinatorMessage::kWarmUp:
      case v1::CoordinatorMessage::kDrain: {
        if (message.has_stop()) InterruptFor(message.stop().job_id(), message.stop().generation());
        absl::MutexLock lock(&mu_);
        commands_.push_back(message);
        cv_.SignalAll();
        break;
      }
      case v1::CoordinatorMessage::KIND_NOT_SET:
        LOG(WARNING) << "ignoring an empty message from the coordinator";
        break;
    }
  }
  absl::MutexLock lock(&mu_);
  session_ended_ = true;
  if (welcomed_stream_ == stream) welcomed_stream_.reset();
  cv_.SignalAll();
}

void WorkerAgent::HandleWelcome(const std::shared_ptr<AttachStream>& stream,
                                const v1::Welcome& welcome) {
  std::optional<Assignment> held;
  metrics_.attached.Set(1);
  const v1::Progress progress = ToProto(trainer_->progress());  // not under mu_
  {
    absl::MutexLock lock(&mu_);
    session_welcome_ = welcome;
    welcomed_stream_ = stream;
    held = held_;
    // Generations are the coordinator's: another coordinator (an empty data
    // dir may reuse job ids) starts the count afresh.
    if (welcome.coordinator_id() != coordinator_id_) {
      newest_generation_.clear();
      last_warm_sequence_ = 0;
    }
    coordinator_id_ = welcome.coordinator_id();
    // A COMPLETED that went out on a stream whose coordinator then died
    // unread would leave the job RUNNING at its last step forever: the
    // assignment is still held, so say it again (a repeat is harmless).
    if (held_.has_value() && held_state_ == v1::ASSIGNMENT_STATE_COMPLETED) {
      bool pending = false;
      for (const v1::AssignmentStatus& status : pending_statuses_) {
        pending |= status.job_id() == held_->job_id.value() &&
                   status.generation() == held_->generation.value() &&
                   status.state() == v1::ASSIGNMENT_STATE_COMPLETED;
      }
      if (!pending) {
        v1::AssignmentStatus status;
        status.set_job_id(held_->job_id.value());
        status.set_generation(held_->generation.value());
        status.set_state(v1::ASSIGNMENT_STATE_COMPLETED);
        *status.mutable_progress() = progress;
        pending_statuses_.push_back(std::move(status));
      }
    }
    cv_.SignalAll();
  }
  LOG(INFO) << "attached to coordinator " << welcome.coordinator_id() << " as "
            << options_.identity.worker_id << " (incarnation " << options_.incarnation
            << ", heartbeat every " << welcome.heartbeat_interval_ms() << " ms, timeout "
            << welcome.heartbeat_timeout_ms() << " ms"
            << (held ? absl::StrCat(", holding job ", held->job_id.value(), " generation ",
                                    held->generation.value())
                     : std::string())
            << ")";
  FlushPendingStatuses(stream);
}

void WorkerAgent::HandleAck(const v1::HeartbeatAck& ack) {
  std::optional<absl::Duration> rtt;
  {
    absl::MutexLock lock(&mu_);
    auto it = heartbeat_sent_at_.find(ack.sequence());
    if (it != heartbeat_sent_at_.end()) rtt = clock_->Now() - it->second;
    // Acks come in order: anything at or before this sequence is answered or lost.
    absl::erase_if(heartbeat_sent_at_,
                   [&](const auto& entry) { return entry.first <= ack.sequence(); });
  }
  if (rtt.has_value()) metrics_.heartbeat_rtt.Observe(absl::ToDoubleSeconds(*rtt));
}

void WorkerAgent::HeartbeatLoop(const std::shared_ptr<AttachStream>& stream,
                                absl::Duration interval, absl::Duration timeout) {
  absl::Time next = absl::Now();
  while (true) {
    bool extra = false;  // asked for by ReportProgressNow before `next`
    {
      absl::MutexLock lock(&mu_);
      while (!session_ended_ && !StoppingLocked() && !progress_due_ &&
             !cv_.WaitWithDeadline(&mu_, next)) {
      }
      if (session_ended_ || StoppingLocked()) return;
      extra = progress_due_ && absl::Now() < next;
      progress_due_ = false;
      const absl::Duration silence = clock_->Now() - last_received_;
      if (silence > timeout) {
        LOG(WARNING) << "nothing from the coordinator for " << silence << " (heartbeat timeout "
                     << timeout << "); abandoning this stream";
        stream->Cancel();
        return;
      }
    }
    SendHeartbeat(stream);
    if (extra) continue;  // the regular one still goes at `next`
    const absl::Time now = absl::Now();
    next += interval;
    // After a stall, resume the cadence instead of sending a burst.
    if (next < now) next = now + interval;
  }
}

void WorkerAgent::ReportProgressNow() {
  absl::MutexLock lock(&mu_);
  progress_due_ = true;
  cv_.SignalAll();
}

void WorkerAgent::SendHeartbeat(const std::shared_ptr<AttachStream>& stream) {
  const TrainingProgress progress = trainer_->progress();
  v1::WorkerMessage message = NewMessage();
  v1::Heartbeat* heartbeat = message.mutable_heartbeat();
  *heartbeat->mutable_progress() = ToProto(progress);
  const v1::WarmSpare warm = trainer_->warm_status();
  if (warm.state() != v1::WARM_SPARE_STATE_UNSPECIFIED) *heartbeat->mutable_warm() = warm;
  metrics_.warm_spare_memory.Set(
      warm.state() == v1::WARM_SPARE_STATE_WARM ? static_cast<double>(warm.bytes()) : 0.0);
  uint64_t sequence = 0;
  {
    absl::MutexLock lock(&mu_);
    sequence = next_heartbeat_sequence_++;
    heartbeat->set_sequence(sequence);
    if (held_.has_value()) {
      heartbeat->set_job_id(held_->job_id.value());
      heartbeat->set_generation(held_->generation.value());
    }
    // Recorded before the write: the ack may arrive before Write returns.
    heartbeat_sent_at_[sequence] = clock_->Now();
  }
  metrics_.resident_memory.Set(static_cast<double>(ResidentMemoryBytes()));
  metrics_.step.Set(static_cast<double>(progress.step.value()));
  if (progress.loss.has_value()) metrics_.loss.Set(*progress.loss);
  metrics_.tokens_per_second.Set(progress.tokens_per_second);
  metrics_.tokens_per_second_average.Set(progress.tokens_per_second_average);
  metrics_.step_time.Set(progress.step_time_seconds);
  if (stream->Write(message)) {
    metrics_.heartbeats_sent.Increment();
  } else {
    absl::MutexLock lock(&mu_);
    heartbeat_sent_at_.erase(sequence);
  }
}

void WorkerAgent::CloseStream(const std::shared_ptr<AttachStream>& stream) {
  // Say goodbye first so the coordinator does not count this as a failure.
  v1::WorkerMessage leave;
  leave.set_incarnation(options_.incarnation.value());
  leave.mutable_leave()->set_reason("worker shutting down");
  stream->Write(leave);
  stream->WritesDone();
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + options_.close_timeout;
  while (!session_ended_ && !cv_.WaitWithDeadline(&mu_, deadline)) {
  }
  if (!session_ended_) {
    LOG(WARNING) << "coordinator did not close the stream within " << options_.close_timeout
                 << "; cancelling it";
    stream->Cancel();
  }
}

void WorkerAgent::CommandLoop() {
  while (true) {
    v1::CoordinatorMessage command;
    {
      absl::MutexLock lock(&mu_);
      while (commands_.empty() && !command_thread_exit_) cv_.Wait(&mu_);
      if (command_thread_exit_) return;
      command = std::move(commands_.front());
      commands_.pop_front();
    }
    if (IsStale(command)) continue;
    switch (command.kind_case()) {
      case v1::CoordinatorMessage::kAssign:
        ExecuteAssign(command.assign());
        break;
      case v1::CoordinatorMessage::kReconfigure:
        ExecuteReconfigure(command.reconfigure());
        break;
      case v1::CoordinatorMessage::kStop:
        ExecuteStop(command.stop());
        break;
      case v1::CoordinatorMessage::kDrain:
        ExecuteDrain(command.drain());
        return;  // nothing after a Drain is executed
      case v1::CoordinatorMessage::kSuspend:
        ExecuteSuspend(command.suspend());
        break;
      case v1::CoordinatorMessage::kWarmUp:
        ExecuteWarmUp(command.warm_up());
        break;
      default:
        break;
    }
  }
}

bool WorkerAgent::IsStale(const v1::CoordinatorMessage& command) {
  const std::optional<CommandTarget> target = CommandTargetOf(command);
  if (!target.has_value()) return false;
  const std::string& job = target->job_id;
  const uint64_t generation = target->generation;
  absl::MutexLock lock(&mu_);
  uint64_t& newest = newest_generation_[job];
  if (generation < newest) {
    // Even with nothing held (a donor that handed its state over, a stopped
    // member), a command older than one already executed was overtaken.
    LOG(INFO) << "ignoring a command of job " << job << " generation " << generation
              << ": generation " << newest << " was already commanded";
    return true;
  }
  newest = generation;
  if (newest_generation_.size() > kMaxRememberedJobs) {
    // Bounded: forget some other job (its commands are long gone).
    for (auto it = newest_generation_.begin(); it != newest_generation_.end(); ++it) {
      if (it->first != job) {
        newest_generation_.erase(it);
        break;
      }
    }
  }
  return false;
}

void WorkerAgent::ExecuteWarmUp(const v1::WarmUp& warm) {
  {
    absl::MutexLock lock(&mu_);
    // Queued with the commands (the trainer prepares in the background, and
    // a Prepare after it takes or releases what it prepared), but two
    // coordinator calls' messages can cross.
    if (warm.sequence() <= last_warm_sequence_) return;  // an older one
    last_warm_sequence_ = warm.sequence();
    if (!warm.job_id().empty() && held_.has_value() &&
        held_state_ != v1::ASSIGNMENT_STATE_COMPLETED) {
      LOG(INFO) << "ignoring a WarmUp of job " << warm.job_id() << ": this worker holds job "
                << held_->job_id << " (taken into it since)";
      return;
    }
  }
  trainer_->Warm(WarmSlotOf(warm));
}

void WorkerAgent::ExecuteAssign(const v1::Assign& assign) {
  const JobId job(assign.job_id());
  const Generation generation(assign.generation());
  std::optional<v1::AssignmentState> repeat_state;
  std::optional<JobId> replaced;
  {
    absl::MutexLock lock(&mu_);
    if (held_.has_value() && held_->job_id == job) {
      if (generation < held_->generation) {
        LOG(INFO) << "ignoring stale Assign of job " << job << " generation " << generation
                  << " (holding generation " << held_->generation << ")";
        return;
      }
      if (generation == held_->generation) repeat_state = held_state_;
    } else if (held_.has_value()) {
      replaced = held_->job_id;
    }
  }
  if (repeat_state.has_value()) {
    LOG(INFO) << "repeated Assign of job " << job << " generation " << generation
              << "; answering with the held state";
    SendStatus(job, generation, *repeat_state, "");
    return;
  }
  if (replaced.has_value()) {
    LOG(WARNING) << "Assign of job " << job << " replaces held job " << *replaced
                 << " (no Stop came first)";
    trainer_->Stop();
  }
  LOG(INFO) << "assigned job " << job << " generation " << generation << " at "
            << CoordinatesString(assign.coordinates()) << " of mesh " << MeshString(assign.mesh());
  Assignment assignment;
  assignment.job_id = job;
  assignment.generation = generation;
  assignment.spec = assign.spec();
  assignment.mesh = assign.mesh();
  assignment.coordinates = assign.coordinates();
  assignment.recovery = assign.recovery();
  assignment.participant = assign.coordinates().rank();
  PrepareAndReport(std::move(assignment));
}

void WorkerAgent::ExecuteReconfigure(const v1::Reconfigure& reconfigure) {
  const JobId job(reconfigure.job_id());
  const Generation generation(reconfigure.generation());
  std::optional<Assignment> next;
  std::optional<v1::AssignmentState> repeat_state;
  {
    absl::MutexLock lock(&mu_);
    if (!held_.has_value() || held_->job_id != job) {
      // Fall through to FAILED below: without the Assign there is no spec.
    } else if (generation < held_->generation) {
      LOG(INFO) << "ignoring stale Reconfigure of job " << job << " generation " << generation
                << " (holding generation " << held_->generation << ")";
      return;
    } else if (generation == held_->generation) {
      repeat_state = held_state_;
    } else {
      next = *held_;
    }
  }
  if (repeat_state.has_value()) {
    LOG(INFO) << "repeated Reconfigure of job " << job << " generation " << generation
              << "; answering with the held state";
    std::vector<v1::HeldState> held;
    if (*repeat_state == v1::ASSIGNMENT_STATE_SUSPENDED) held = trainer_->Suspend();
    SendStatus(job, generation, *repeat_state, "", held);
    return;
  }
  if (!next.has_value() && reconfigure.role() != v1::RECONFIGURE_ROLE_DONOR &&
      reconfigure.has_spec()) {
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
    ExecuteAssign(assign);
    return;
  }
  if (!next.has_value()) {
    LOG(WARNING) << "Reconfigure of job " << job << " which this worker does not hold";
    SendStatus(job, generation, v1::ASSIGNMENT_STATE_FAILED,
               absl::StrCat("worker ", options_.identity.worker_id, " does not hold job ",
                            job.value(), "; it needs an Assign"));
    return;
  }
  LOG(INFO) << "reconfigure job " << job << " generation " << next->generation << " -> "
            << generation << " (" << reconfigure.reason() << "): now at "
            << CoordinatesString(reconfigure.coordinates()) << " of mesh "
            << MeshString(reconfigure.mesh());
  next->generation = generation;
  next->mesh = reconfigure.mesh();
  next->coordinates = reconfigure.coordinates();
  next->recovery = reconfigure.recovery();
  next->donor = reconfigure.role() == v1::RECONFIGURE_ROLE_DONOR;
  next->participant = reconfigure.coordinates().rank();
  if (next->donor) {
    next->participant = -1;
    for (int i = 0; i < reconfigure.recovery().donors_size(); ++i) {
      if (reconfigure.recovery().donors(i).worker_id() == options_.identity.worker_id) {
        next->participant = reconfigure.mesh().members_size() + i;
      }
    }
    ExecuteDonate(std::move(*next));
    return;
  }
  PrepareAndReport(std::move(*next));
}

void WorkerAgent::ExecuteStop(const v1::Stop& stop) {
  const JobId job(stop.job_id());
  const Generation generation(stop.generation());
  bool holds = false;
  {
    absl::MutexLock lock(&mu_);
    holds = held_.has_value() && held_->job_id == job;
    if (holds && generation < held_->generation) {
      LOG(INFO) << "ignoring stale Stop of job " << job << " generation " << generation
                << " (holding generation " << held_->generation << ")";
      return;
    }
  }
  if (holds) {
    LOG(INFO) << "stopping job " << job << " generation " << generation << ": " << stop.reason();
    trainer_->Stop();
    absl::MutexLock lock(&mu_);
    held_.reset();
    held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  } else {
    LOG(INFO) << "Stop of job " << job << " which this worker does not hold; answering RELEASED";
  }
  metrics_.assignment_generation.Set(0);
  SendStatus(job, generation, v1::ASSIGNMENT_STATE_RELEASED, "");
}

void WorkerAgent::ExecuteDrain(const v1::Drain& drain) {
  LOG(INFO) << "draining: " << drain.reason();
  trainer_->Stop();
  std::optional<Assignment> released;
  {
    absl::MutexLock lock(&mu_);
    released = std::move(held_);
    held_.reset();
    held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  }
  metrics_.assignment_generation.Set(0);
  if (released.has_value()) {
    SendStatus(released->job_id, released->generation, v1::ASSIGNMENT_STATE_RELEASED,
               absl::StrCat("drained: ", drain.reason()));
  }
  // Set after the status is written, so the half-close follows it.
  absl::MutexLock lock(&mu_);
  drain_requested_ = true;
  cv_.SignalAll();
}

void WorkerAgent::InterruptFor(const std::string& job, uint64_t generation) {
  // Not filtered by what is held: the message may overtake the Prepare it
  // is meant to interrupt (queued, not yet begun); the trainer keeps the
  // interrupt for it.
  trainer_->Interrupt(JobId(job), Generation(generation));
}

void WorkerAgent::ExecuteSuspend(const v1::Suspend& suspend) {
  const JobId job(suspend.job_id());
  const Generation generation(suspend.generation());
  {
    absl::MutexLock lock(&mu_);
    if (held_.has_value() && held_->job_id == job && generation < held_->generation) {
      LOG(INFO) << "ignoring stale Suspend of job " << job << " generation " << generation
                << " (holding generation " << held_->generation << ")";
      return;
    }
    if (!held_.has_value() || held_->job_id != job) {
      // Nothing of this job here: say so, so the coordinator does not wait.
      LOG(INFO) << "Suspend of job " << job << " which this worker does not hold";
    }
  }
  const std::vector<v1::HeldState> held = trainer_->Suspend();
  {
    absl::MutexLock lock(&mu_);
    if (held_.has_value() && held_->job_id == job) held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
  }
  LOG(INFO) << "suspended job " << job << " generation " << generation << " ("
            << suspend.reason() << "): holding " << held.size() << " consistent state(s)"
            << (held.empty() ? "" : absl::StrCat(", newest step ", held[0].step(), " of generation ",
                                                 held[0].generation()));
  SendStatus(job, generation, v1::ASSIGNMENT_STATE_SUSPENDED, suspend.reason(), held);
}

void WorkerAgent::ExecuteDonate(Assignment assignment) {
  const JobId job = assignment.job_id;
  const Generation generation = assignment.generation;
  LOG(INFO) << "donating this worker's state of job " << job << " to generation " << generation
            << " as participant " << assignment.participant;
  {
    // Held while donating: a Suspend or Stop of the generation it donates
    // from, delivered late, is stale and must not interrupt the donation.
    absl::MutexLock lock(&mu_);
    held_ = assignment;
    held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  }
  const absl::Status donated = assignment.participant < 0
                                   ? absl::InvalidArgumentError("not among the plan's donors")
                                   : trainer_->Donate(assignment);
  {
    absl::MutexLock lock(&mu_);
    if (donated.ok()) {
      held_.reset();
      held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
    } else {
      // The trainer keeps the source state (EngineTrainer::Donate): the
      // coordinator asks for it in its next re-plan, which may make this
      // worker a member or a donor again, or release it.
      held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
    }
  }
  if (donated.ok()) metrics_.assignment_generation.Set(0);
  if (!donated.ok()) LOG(WARNING) << "donating to job " << job << ": " << donated;
  SendStatus(job, generation, v1::ASSIGNMENT_STATE_DONATED, donated.ok() ? "" : donated.ToString());
}

void WorkerAgent::ReportSuspended(const JobId& job, Generation generation,
                                  const std::vector<v1::HeldState>& held,
                                  const absl::Status& why) {
  std::vector<std::string> unreachable;
  {
    absl::MutexLock lock(&mu_);
    if (!held_.has_value() || held_->job_id != job || held_->generation != generation) return;
    held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
    unreachable = UnreachableWorkers(*held_, why);
  }
  SendStatus(job, generation, v1::ASSIGNMENT_STATE_SUSPENDED, std::string(why.message()), held, {},
             unreachable);
}

void WorkerAgent::PrepareAndReport(Assignment assignment) {
  const JobId job = assignment.job_id;
  const Generation generation = assignment.generation;
  {
    absl::MutexLock lock(&mu_);
    held_ = assignment;
    held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  }
  metrics_.assignment_generation.Set(static_cast<double>(generation.value()));
  const absl::Status prepared = trainer_->Prepare(assignment);
  if (prepared.ok()) {
    {
      absl::MutexLock lock(&mu_);
      if (held_.has_value() && held_->job_id == job && held_->generation == generation) {
        held_state_ = v1::ASSIGNMENT_STATE_READY;
      }
    }
    LOG(INFO) << "ready for job " << job << " generation " << generation;
    SendStatus(job, generation, v1::ASSIGNMENT_STATE_READY, "", {}, trainer_->last_prepare());
    return;
  }
  if (absl::IsUnavailable(prepared) || absl::IsAborted(prepared) ||
      absl::IsCancelled(prepared) || absl::IsDeadlineExceeded(prepared)) {
    // A peer or the coordinator went away: not this job's failure. The state
    // held before stays; the coordinator re-plans.
    LOG(WARNING) << "preparing job " << job << " generation " << generation
                 << " was cut short: " << prepared << "; waiting for a new plan";
    const std::vector<v1::HeldState> held = trainer_->Suspend();
    {
      absl::MutexLock lock(&mu_);
      if (held_.has_value() && held_->job_id == job) held_state_ = v1::ASSIGNMENT_STATE_SUSPENDED;
    }
    SendStatus(job, generation, v1::ASSIGNMENT_STATE_SUSPENDED, prepared.ToString(), held, {},
               UnreachableWorkers(assignment, prepared));
    return;
  }
  LOG(ERROR) << "cannot run job " << job << " generation " << generation << ": " << prepared;
  trainer_->Stop();
  {
    absl::MutexLock lock(&mu_);
    held_.reset();
    held_state_ = v1::ASSIGNMENT_STATE_UNSPECIFIED;
  }
  metrics_.assignment_generation.Set(0);
  SendStatus(job, generation, v1::ASSIGNMENT_STATE_FAILED, prepared.ToString());
}

void WorkerAgent::ReportTrainingFinished(const JobId& job, Generation generation,
                                         const absl::Status& status) {
  const v1::AssignmentState state =
      status.ok() ? v1::ASSIGNMENT_STATE_COMPLETED : v1::ASSIGNMENT_STATE_FAILED;
  {
    absl::MutexLock lock(&mu_);
    if (!held_.has_value() || held_->job_id != job || held_->generation != generation) {
      LOG(INFO) << "training of job " << job << " generation " << generation
                << " ended after the assignment changed; not reported";
      return;
    }
    held_state_ = state;
  }
  if (status.ok()) {
    LOG(INFO) << "job " << job << " generation " << generation << " completed";
  } else {
    LOG(ERROR) << "job " << job << " generation " << generation << " failed: " << status;
  }
  SendStatus(job, generation, state, status.ok() ? "" : status.ToString());
}

void WorkerAgent::SendStatus(const JobId& job, Generation generation, v1::AssignmentState state,
                             const std::string& message, const std::vector<v1::HeldState>& held,
                             const v1::PreparePhases& prepare,
                             const std::vector<std::string>& unreachable) {
  v1::AssignmentStatus status;
  status.set_job_id(job.value());
  status.set_generation(generation.value());
  status.set_state(state);
  status.set_message(message);
  for (const v1::HeldState& h : held) *status.add_held_states() = h;
  if (state == v1::ASSIGNMENT_STATE_READY) *status.mutable_prepare() = prepare;
  for (const std::string& worker : unreachable) status.add_unreachable_workers(worker);
  *status.mutable_progress() = ToProto(trainer_->progress());
  std::shared_ptr<AttachStream> stream;
  {
    absl::MutexLock lock(&mu_);
    if (pending_statuses_.size() >= kMaxPendingStatuses) {
      LOG(WARNING) << "dropping undelivered status of job " << pending_statuses_.front().job_id()
                   << " generation " << pending_statuses_.front().generation();
      pending_statuses_.pop_front();
    }
    pending_statuses_.push_back(std::move(status));
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
      if (pending_statuses_.empty()) return;
      *message.mutable_status() = pending_statuses_.front();
    }
    if (!stream->Write(message)) return;  // kept for the next stream
    absl::MutexLock lock(&mu_);
    pending_statuses_.pop_front();
  }
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
