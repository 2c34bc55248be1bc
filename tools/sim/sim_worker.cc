#include "tools/sim/sim_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::sim {

SimWorker::SimWorker(Options options, const MeasurementWindow* window, SimCounters* counters)
    : options_(std::move(options)), window_(window), counters_(counters) {}

void SimWorker::Start(v1::Workers::Stub* stub, grpc::CompletionQueue* queue) {
  v1::WorkerMessage hello_message;
  hello_message.set_incarnation(options_.incarnation);
  v1::Hello* hello = hello_message.mutable_hello();
  hello->set_worker_id(options_.worker_id);
  hello->set_host(options_.host);
  hello->set_device_kind(v1::DEVICE_KIND_CPU);
  hello->set_device_index(options_.device_index);
  hello->set_incarnation(options_.incarnation);
  v1::Capabilities* caps = hello->mutable_capabilities();
  caps->set_cpu_cores(1);
  caps->set_memory_bytes(int64_t{1} << 30);
  caps->set_device_name("cohort-sim");

  absl::MutexLock lock(&mu_);
  CHECK(state_ == State::kNew) << "SimWorker::Start called twice";
  state_ = State::kConnecting;
  // The Hello is written once the call has started.
  writing_ = true;
  writing_message_ = std::move(hello_message);
  stream_ = stub->PrepareAsyncAttach(&context_, queue);
  starting_ = true;
  stream_->StartCall(&start_event_);
}

void SimWorker::Proceed(void* tag, bool ok) {
  Event* event = static_cast<Event*>(tag);
  SimWorker* worker = event->worker;
  absl::MutexLock lock(&worker->mu_);
  switch (event->op) {
    case Op::kStart:
      worker->OnStarted(ok);
      break;
    case Op::kRead:
      worker->OnRead(ok);
      break;
    case Op::kWrite:
      worker->OnWrite(ok);
      break;
    case Op::kWritesDone:
      worker->writes_done_pending_ = false;
      break;
    case Op::kFinish:
      worker->OnFinished();
      break;
  }
  worker->MaybeDoneLocked();
}

void SimWorker::SendHeartbeat() {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kAttached) return;
  const uint64_t sequence = next_sequence_++;
  awaiting_ack_.push_back({sequence, MonotonicNanos()});
  v1::WorkerMessage message;
  message.set_incarnation(options_.incarnation);
  v1::Heartbeat* heartbeat = message.mutable_heartbeat();
  heartbeat->set_sequence(sequence);
  if (!job_id_.empty()) {
    heartbeat->set_job_id(job_id_);
    heartbeat->set_generation(generation_);
    heartbeat->mutable_progress()->set_step(++step_);
    heartbeat->mutable_progress()->set_step_time_seconds(0.1);
  }
  Enqueue(std::move(message));
}

void SimWorker::Close() {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kNew) {
    state_ = State::kDone;  // never started: nothing to close
    return;
  }
  if (state_ == State::kClosing || state_ == State::kDone || finish_started_) return;
  state_ = State::kClosing;
  outbox_.clear();
  // A simulated worker that stops says so, like cohort-worker does.
  v1::WorkerMessage leave;
  leave.set_incarnation(options_.incarnation);
  leave.mutable_leave()->set_reason("cohort-sim finished");
  outbox_.push_back(std::move(leave));
  if (!writing_) NextWriteLocked();
}

void SimWorker::Cancel() { context_.TryCancel(); }

bool SimWorker::attached() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kAttached;
}

bool SimWorker::done() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kDone;
}

std::string SimWorker::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

int64_t SimWorker::PendingInWindow() const {
  absl::MutexLock lock(&mu_);
  int64_t pending = 0;
  for (const SentHeartbeat& sent : awaiting_ack_) pending += window_->Contains(sent.sent_ns);
  return pending;
}

SimWorker::Results SimWorker::TakeResults() {
  absl::MutexLock lock(&mu_);
  Results results;
  results.rtt_ms = std::move(rtt_ms_);
  rtt_ms_.clear();
  results.unacked = unacked_;
  for (const SentHeartbeat& sent : awaiting_ack_)
    results.unacked += window_->Contains(sent.sent_ns);
  awaiting_ack_.clear();
  unacked_ = 0;
  results.error = error_;
  return results;
}

void SimWorker::OnStarted(bool ok) {
  starting_ = false;
  if (!ok) {
    // No call: the status says why.
    writing_ = false;
    outbox_.clear();
    StartFinishLocked();
    return;
  }
  stream_->Write(writing_message_, &write_event_);
  reading_ = true;
  stream_->Read(&incoming_, &read_event_);
}

void SimWorker::OnRead(bool ok) {
  reading_ = false;
  const int64_t now_ns = MonotonicNanos();
  if (!ok) {
    // The coordinator finished the call: expected after our Close, a
    // failure otherwise (the status says why).
    if (state_ != State::kClosing) failed_ = true;
    outbox_.clear();
    StartFinishLocked();
    return;
  }
  switch (incoming_.kind_case()) {
    case v1::CoordinatorMessage::kWelcome:
      if (state_ == State::kConnecting) {
        state_ = State::kAttached;
        counters_->attached.fetch_add(1);
        counters_->last_welcome_ns.store(now_ns);
        counters_->heartbeat_timeout_ms.store(incoming_.welcome().heartbeat_timeout_ms());
      }
      break;
    case v1::CoordinatorMessage::kHeartbeatAck:
      HandleAck(incoming_.heartbeat_ack().sequence(), now_ns);
      break;
    case v1::CoordinatorMessage::kAssign:
      ReplyStatus(incoming_.assign().job_id(), incoming_.assign().generation(),
                  v1::ASSIGNMENT_STATE_READY);
      break;
    case v1::CoordinatorMessage::kReconfigure:
      ReplyStatus(incoming_.reconfigure().job_id(), incoming_.reconfigure().generation(),
                  incoming_.reconfigure().role() == v1::RECONFIGURE_ROLE_DONOR
                      ? v1::ASSIGNMENT_STATE_DONATED
                      : v1::ASSIGNMENT_STATE_READY);
      break;
    case v1::CoordinatorMessage::kSuspend:
      // A simulated worker holds no state.
      ReplyStatus(incoming_.suspend().job_id(), incoming_.suspend().generation(),
                  v1::ASSIGNMENT_STATE_SUSPENDED);
      break;
    case v1::CoordinatorMessage::kStop:
      ReplyStatus(incoming_.stop().job_id(), incoming_.stop().generation(),
                  v1::ASSIGNMENT_STATE_RELEASED);
      break;
    case v1::CoordinatorMessage::kWarmUp:  // nothing to prepare: no session
    case v1::CoordinatorMessage::kDrain:
    case v1::CoordinatorMessage::KIND_NOT_SET:
      break;
  }
  reading_ = true;
  stream_->Read(&incoming_, &read_event_);
}

void SimWorker::OnWrite(bool ok) {
  writing_ = false;
  if (!ok) {
    // The stream broke; the failed read reports it and asks for the status.
    outbox_.clear();
    return;
  }
  NextWriteLocked();
}

void SimWorker::OnFinished() {
  finishing_ = false;
  finished_ = true;
  const bool was_attached = state_ == State::kAttached || state_ == State::kClosing;
  // Without a Welcome the worker never attached, whatever the reason.
  if (state_ == State::kConnecting) {
    counters_->failed_attach.fetch_add(1);
    failed_ = true;
  }
  if (!status_.ok() || failed_) {
    counters_->stream_errors.fetch_add(1);
    error_ = absl::StrCat(options_.worker_id, ": stream ended",
                          was_attached ? "" : " before the Welcome", ": code ",
                          static_cast<int>(status_.error_code()), " ", status_.error_message());
  }
}

void SimWorker::MaybeDoneLocked() {
  if (!finished_ || state_ == State::kDone || starting_ || reading_ || writing_ ||
      writes_done_pending_ || finishing_) {
    return;
  }
  state_ = State::kDone;
  counters_->done.fetch_add(1);
}

void SimWorker::Enqueue(v1::WorkerMessage message) {
  if (finish_started_) return;  // the stream is over
  outbox_.push_back(std::move(message));
  if (!writing_) NextWriteLocked();
}

void SimWorker::NextWriteLocked() {
  if (finish_started_) return;
  if (!outbox_.empty()) {
    writing_ = true;
    writing_message_ = std::move(outbox_.front());
    outbox_.pop_front();
    stream_->Write(writing_message_, &write_event_);
  } else if (state_ == State::kClosing && !writes_done_started_) {
    writes_done_started_ = true;
    writes_done_pending_ = true;
    stream_->WritesDone(&writes_done_event_);
  }
}

void SimWorker::StartFinishLocked() {
  if (finish_started_) return;
  finish_started_ = true;
  finishing_ = true;
  stream_->Finish(&status_, &finish_event_);
}

void SimWorker::HandleAck(uint64_t sequence, int64_t now_ns) {
  // Acks come in order; older heartbeats still waiting were skipped.
  while (!awaiting_ack_.empty() && awaiting_ack_.front().sequence < sequence) {
    unacked_ += window_->Contains(awaiting_ack_.front().sent_ns);
    awaiting_ack_.pop_front();
  }
  if (awaiting_ack_.empty() || awaiting_ack_.front().sequence != sequence) return;
  const int64_t sent_ns = awaiting_ack_.front().sent_ns;
  awaiting_ack_.pop_front();
  if (window_->Contains(sent_ns)) rtt_ms_.push_back(static_cast<double>(now_ns - sent_ns) / 1e6);
}

void SimWorker::ReplyStatus(const std::string& job_id, uint64_t generation,
                            v1::AssignmentState state) {
  if (state_ != State::kAttached) return;
  v1::WorkerMessage message;
  message.set_incarnation(options_.incarnation);
  v1::AssignmentStatus* status = message.mutable_status();
  status->set_job_id(job_id);
  status->set_generation(generation);
  status->set_state(state);
  Enqueue(std::move(message));
  counters_->assignments.fetch_add(1);
  if (state == v1::ASSIGNMENT_STATE_READY) {
    job_id_ = job_id;
    generation_ = generation;
  } else if (job_id == job_id_) {
    job_id_.clear();  // suspended, released or donated: no progress to report
  }
}

}  // namespace cohort::sim
