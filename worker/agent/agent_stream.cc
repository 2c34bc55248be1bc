// WorkerAgent's Attach stream: one session from Hello to Finish, the reader
// thread, heartbeats and the close (agent.cc holds the run loop and the
// commands).

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/process_info.h"
#include "worker/agent/agent.h"

namespace cohort::worker {

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
    if (std::optional<v1::HeldAssignment> held = protocol_.HeldForHello()) {
      *hello->mutable_held() = std::move(*held);
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
    const absl::Time deadline = clock_->Now() + options_.welcome_timeout;
    while (!session_ended_ && !session_welcome_.has_value() && !StoppingLocked() &&
           WaitSliceLocked(deadline)) {
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
      case v1::CoordinatorMessage::kAssign:
      case v1::CoordinatorMessage::kReconfigure:
      case v1::CoordinatorMessage::kSuspend:
      case v1::CoordinatorMessage::kStop:
      case v1::CoordinatorMessage::kWarmUp:
      case v1::CoordinatorMessage::kDrain: {
        // A Suspend or Stop interrupts the Prepare or Donate it is meant for
        // at once, even one still queued (the trainer keeps the interrupt).
        if (std::optional<CommandTarget> target = InterruptTargetOf(message)) {
          trainer_->Interrupt(JobId(target->job_id), Generation(target->generation));
        }
        absl::MutexLock lock(&mu_);
        protocol_.Receive(message);
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
  const v1::Progress progress = ProgressProto(trainer_->progress());  // not under mu_
  {
    absl::MutexLock lock(&mu_);
    session_welcome_ = welcome;
    welcomed_stream_ = stream;
    held = protocol_.held();
    protocol_.OnWelcome(welcome, progress);
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
  absl::Time next = clock_->Now();
  while (true) {
    bool extra = false;  // asked for by ReportProgressNow before `next`
    {
      absl::MutexLock lock(&mu_);
      while (!session_ended_ && !StoppingLocked() && !progress_due_ &&
             WaitSliceLocked(next)) {
      }
      if (session_ended_ || StoppingLocked()) return;
      extra = progress_due_ && clock_->Now() < next;
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
    const absl::Time now = clock_->Now();
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
  *heartbeat->mutable_progress() = ProgressProto(progress);
  const v1::WarmSpare warm = trainer_->warm_status();
  if (warm.state() != v1::WARM_SPARE_STATE_UNSPECIFIED) *heartbeat->mutable_warm() = warm;
  metrics_.warm_spare_memory.Set(
      warm.state() == v1::WARM_SPARE_STATE_WARM ? static_cast<double>(warm.bytes()) : 0.0);
  uint64_t sequence = 0;
  {
    absl::MutexLock lock(&mu_);
    sequence = next_heartbeat_sequence_++;
    heartbeat->set_sequence(sequence);
    if (const std::optional<Assignment>& held = protocol_.held()) {
      heartbeat->set_job_id(held->job_id.value());
      heartbeat->set_generation(held->generation.value());
    }
    // Recorded before the write: the ack may arrive before Write returns.
    heartbeat_sent_at_[sequence] = clock_->Now();
  }
  metrics_.resident_memory.Set(static_cast<double>(ResidentMemoryBytes()));
  metrics_.RefreshAttentionImplementation();
  metrics_.RefreshCudaGraphs();
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
  const absl::Time deadline = clock_->Now() + options_.close_timeout;
  while (!session_ended_ && WaitSliceLocked(deadline)) {
  }
  if (!session_ended_) {
    LOG(WARNING) << "coordinator did not close the stream within " << options_.close_timeout
                 << "; cancelling it";
    stream->Cancel();
  }
}

}  // namespace cohort::worker
