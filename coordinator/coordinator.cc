#include "coordinator/coordinator.h"

#include <limits>
#include <optional>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_spec/validator.h"
#include "common/log.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/jobs/worker_commands.h"
#include "coordinator/paging.h"

namespace cohort::coordinator {
namespace {

std::string RandomCoordinatorId() {
  std::random_device device;
  return absl::StrFormat("%08x%08x", device(), device());
}

}  // namespace

Coordinator::SectionLock::SectionLock(const Coordinator* coordinator, LockSection section)
    : coordinator_(coordinator), section_(section), arrived_(absl::Now()) {
  coordinator_->mu_.Lock();
  acquired_ = absl::Now();
}

Coordinator::SectionLock::~SectionLock() {
  const absl::Time released = absl::Now();
  coordinator_->mu_.Unlock();
  if (coordinator_->metrics_ != nullptr) {
    coordinator_->metrics_->LockSectionTimed(section_, acquired_ - arrived_, released - acquired_);
  }
}

absl::Status Coordinator::Deliveries::Run() {
  absl::Status flushed;
  if (persister != nullptr && persist_through > 0) {
    flushed = persister->Flush(persist_through);  // logs failures itself
  }
  for (Outgoing& out : messages) {
    if (out.base == nullptr) {
      out.sink->Send(std::move(out.message));
    } else {
      out.sink->Send(Effects::Message::WithBase(*out.base, out.message));
    }
  }
  for (auto& [sink, event] : events) sink->OnEvent(event);
  for (auto& sink : finished) sink->OnFinished();
  for (KvCompletion& completion : kv) completion.Run();
  return flushed;
}

Coordinator::Coordinator(Options options, std::unique_ptr<JobStore> store, const Clock* clock,
                         CoordinatorMetrics* metrics)
    : options_(std::move(options)),
      clock_(clock),
      metrics_(metrics),
      store_(std::move(store)),
      persister_(std::make_unique<JobPersister>(
          store_.get(),
          [metrics](int64_t records, absl::Duration took) {
            metrics->JobRecordsWritten(records, took);
          })),
      membership_(MembershipTable::Options{.heartbeat_timeout = options_.heartbeat_timeout}),
      jobs_(JobManager::Options{.readopt_grace = options_.readopt_grace,
                                .suspend_timeout = options_.suspend_timeout,
                                .hang_timeout_floor = options_.hang_timeout_floor,
                                .hang_step_multiple = options_.hang_step_multiple,
                                .prepare_timeout = options_.prepare_timeout,
                                .latest_checkpoint = options_.latest_checkpoint,
                                .finished_retention = options_.finished_retention,
                                .warm_spares_per_job = options_.warm_spares_per_job,
                                .partition_hold = options_.partition_hold},
            &membership_, persister_.get()),
      kv_(options_.kv) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(Options options,
                                                                 std::unique_ptr<JobStore> store,
                                                                 const Clock* clock,
                                                                 CoordinatorMetrics* metrics) {
  if (options.coordinator_id.empty()) options.coordinator_id = RandomCoordinatorId();
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_timeout (", absl::FormatDuration(options.heartbeat_timeout),
        ") must exceed a positive heartbeat_interval (",
        absl::FormatDuration(options.heartbeat_interval), ")"));
  }
  std::unique_ptr<Coordinator> coordinator(
      new Coordinator(std::move(options), std::move(store), clock, metrics));
  {
    SectionLock lock(coordinator.get(), LockSection::kOther);
    const absl::Time restored = clock->Now();
    RETURN_IF_ERROR(coordinator->jobs_.Restore(restored));
    // The readoption deadlines count from here: a coordinator that stalls
    // (SIGSTOP, a paused VM) before its first tick must not let them lapse
    // while it could not hear anyone (DiscountOwnStall measures from here).
    coordinator->last_tick_ = restored;
    coordinator->UpdateGauges();
    coordinator->collected_ticket_ = coordinator->persister_->last_ticket();
  }
  // What restoring changed is on disk before anyone is told anything.
  RETURN_IF_ERROR(coordinator->persister_->Flush(coordinator->persister_->last_ticket()));
  return coordinator;
}

void Coordinator::Collect(Effects effects, Deliveries* out) {
  const uint64_t ticket = persister_->last_ticket();
  if (ticket > collected_ticket_) {
    out->persister = persister_.get();
    out->persist_through = ticket;
    collected_ticket_ = ticket;
  }
  for (const LostWorker& worker : effects.lost) {
    metrics_->FailureDetected(worker.reason, worker.silence);
    // Fenced: nothing more is delivered to it, and its messages are refused
    // (the stream ends; it may attach again as a new member).
    auto it = sinks_.find(worker.id);
    if (it != sinks_.end() && it->second.incarnation == worker.incarnation) sinks_.erase(it);
  }
  for (const Effects::Recovery& recovery : effects.recoveries) {
    metrics_->RecoveryCompleted(recovery.kind, recovery.spare, recovery.lost_steps,
                                recovery.detect_to_running);
  }
  for (const Effects::RecoveryPhase& phase : effects.recovery_phases) {
    metrics_->RecoveryPhase(phase.phase, phase.took);
  }
  for (const auto& change : effects.generation_changes) {
    metrics_->GenerationChanged();
    for (KvCompletion& c :
         kv_.DropOlderThan(change.job, change.generation,
                           absl::StrCat("job ", change.job.value(), " moved to generation ",
                                        change.generation.value()))) {
      out->kv.push_back(std::move(c));
    }
  }
  for (const JobId& job : effects.finished_jobs) {
    for (KvCompletion& c : kv_.DropOlderThan(job, Generation(UINT64_MAX),
                                             absl::StrCat("job ", job.value(), " finished"))) {
      out->kv.push_back(std::move(c));
    }
  }
  for (auto& message : effects.messages) {
    auto it = sinks_.find(message.worker);
    if (it == sinks_.end() || it->second.incarnation != message.incarnation) continue;
    out->messages.push_back(
        Deliveries::Outgoing{it->second.sink, std::move(message.message), std::move(message.base)});
  }
  const google::protobuf::Timestamp now = ToProtoTime(clock_->Now());
  for (auto& event : effects.events) {
    const bool terminal = event.job.state() == v1::JOB_STATE_COMPLETED ||
                          event.job.state() == v1::JOB_STATE_FAILED ||
                          event.job.state() == v1::JOB_STATE_CANCELLED;
    // Built once for all watchers. The spec never changes and went with the
    // SNAPSHOT (Watch): a change event carries only what a progress display
    // needs of it, not a copy of the whole spec per event and watcher.
    std::optional<v1::JobEvent> out_event;
    for (auto it = watchers_.begin(); it != watchers_.end();) {
      if (it->second.job.value() != event.job.job_id()) {
        ++it;
        continue;
      }
      if (!out_event.has_value()) {
        out_event.emplace();
        out_event->set_kind(event.kind);
        v1::Job* job = out_event->mutable_job();
        *job = event.job;
        v1::JobSpec summary;
        summary.set_name(event.job.spec().name());
        summary.set_steps(event.job.spec().steps());
        *job->mutable_spec() = std::move(summary);
        *out_event->mutable_time() = now;
      }
      out->events.emplace_back(it->second.sink, *out_event);
      if (terminal) {
        out->finished.push_back(it->second.sink);
        watchers_.erase(it++);
      } else {
        ++it;
      }
    }
  }
}

void Coordinator::UpdateGauges() {
  std::map<WorkerState, int> workers;
  for (WorkerState state :
       {WorkerState::kIdle, WorkerState::kAssigned, WorkerState::kLost, WorkerState::kDraining}) {
    workers[state] = membership_.CountInState(state);
  }
  metrics_->SetWorkerCounts(workers);
  metrics_->SetJobCounts(jobs_.CountByState());
  metrics_->SetValidationLosses(jobs_.LatestValidationLosses());
  metrics_->SetAttachedStreams(static_cast<int>(sinks_.size()));
}

void Coordinator::HandleLost(const std::vector<LostWorker>& lost, Effects* effects) {
  if (lost.empty()) return;
  for (const LostWorker& worker : lost) {
    const std::string from_job = worker.job ? " from job " + worker.job->value() : std::string();
    if (worker.reason == LossReason::kLeft) {
      metrics_->WorkerLeft();
      LOG(INFO) << "worker " << worker.id << " left" << from_job;
    } else {
      metrics_->FailureDetected(worker.reason, worker.silence);
      LOG(WARNING) << "worker " << worker.id << " lost (" << LossReasonName(worker.reason)
                   << ", silent " << absl::FormatDuration(worker.silence) << ")" << from_job;
    }
    auto it = sinks_.find(worker.id);
    if (it != sinks_.end() && it->second.incarnation == worker.incarnation) sinks_.erase(it);
  }
  jobs_.OnWorkersLost(lost, clock_->Now(), effects);
}

absl::StatusOr<v1::Welcome> Coordinator::Attach(const v1::Hello& hello,
                                                std::shared_ptr<WorkerSink> sink) {
  Deliveries deliveries;
  v1::Welcome welcome;
  std::shared_ptr<WorkerSink> superseded;  // closed outside the lock
  {
    SectionLock lock(this, LockSection::kAttach);
    const absl::Time now = clock_->Now();
    DiscountOwnStall(now);  // before anything can time out
    const WorkerRecord* before = membership_.Find(WorkerId(hello.worker_id()));
    const Incarnation old_incarnation = before ? before->incarnation : Incarnation(0);
    ASSIGN_OR_RETURN(JoinResult joined, membership_.Join(hello, now));
    Effects effects;
    if (joined.took_over) {
      LOG(INFO) << "worker " << hello.worker_id() << " attached again on a new stream (the same "
                << "process, incarnation " << hello.incarnation() << "); its old stream is closed"
                << (joined.readopt_into ? " and it is re-adopted in place" : "");
      metrics_->StreamTakenOver();
      auto old = sinks_.find(WorkerId(hello.worker_id()));
      if (old != sinks_.end()) superseded = old->second.sink;
      if (joined.readopt_into) {
        jobs_.ExpectReadoption(WorkerId(hello.worker_id()), *joined.readopt_into, now);
      }
    }
    if (joined.replaced_previous) {
      LOG(INFO) << "worker " << hello.worker_id() << " restarted (new incarnation "
                << hello.incarnation() << "), replacing its old self";
      HandleLost({LostWorker{WorkerId(hello.worker_id()), old_incarnation, joined.previous_job,
                             LossReason::kReplaced, absl::ZeroDuration()}},
                 &effects);
    }
    sinks_[WorkerId(hello.worker_id())] = SinkEntry{Incarnation(hello.incarnation()), sink};
    LOG(INFO) << "worker " << hello.worker_id() << " attached from " << hello.host() << " ("
              << v1::DeviceKind_Name(hello.device_kind()) << " " << hello.device_index()
              << ", incarnation " << hello.incarnation() << ")";
    welcome.set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
    welcome.set_heartbeat_timeout_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_timeout)));
    welcome.set_coordinator_id(options_.coordinator_id);
    // The Welcome must precede any command the join triggers.
    v1::CoordinatorMessage welcome_message;
    *welcome_message.mutable_welcome() = welcome;
    deliveries.messages.push_back({sink, std::move(welcome_message), nullptr});
    jobs_.OnWorkerJoined(hello, now, &effects);
    Collect(std::move(effects), &deliveries);
  }
  if (superseded != nullptr && superseded != sink) superseded->Close();
  deliveries.Run().IgnoreError();  // logged; the writes stay queued
  return welcome;
}

bool Coordinator::Superseded(const WorkerId& worker, const WorkerSink* stream) const {
  if (stream == nullptr) return false;
  auto it = sinks_.find(worker);
  return it == sinks_.end() || it->second.sink.get() != stream;
}

absl::Status Coordinator::OnWorkerMessage(const WorkerId& worker,
                                          const v1::WorkerMessage& message,
                                          const WorkerSink* stream) {
  const absl::Time arrived = absl::Now();
  Deliveries deliveries;
  absl::Status result;
  {
    SectionLock lock(this, message.kind_case() == v1::WorkerMessage::kHeartbeat
                                ? LockSection::kHeartbeat
                                : LockSection::kStatus);
    const absl::Time now = clock_->Now();
    DiscountOwnStall(now);  // before anything can time out
    auto sink = sinks_.find(worker);
    if (sink == sinks_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", worker.value(), " is not attached"));
    }
    if (Superseded(worker, stream)) return absl::OkStatus();  // its process took a newer stream
    if (sink->second.incarnation.value() != message.incarnation()) {
      return absl::AbortedError(absl::StrCat("worker ", worker.value(), " incarnation ",
                                             message.incarnation(), " is not the current one"));
    }
    Effects effects;
    switch (message.kind_case()) {
      case v1::WorkerMessage::kHeartbeat: {
        RETURN_IF_ERROR(membership_.Heartbeat(worker, Incarnation(message.incarnation()), now));
        membership_.SetWarm(worker, message.heartbeat().warm());
        metrics_->HeartbeatReceived();
        v1::CoordinatorMessage ack;
        ack.mutable_heartbeat_ack()->set_sequence(message.heartbeat().sequence());
        deliveries.messages.push_back({sink->second.sink, std::move(ack), nullptr});
        if (!message.heartbeat().job_id().empty()) {
          jobs_.OnProgress(worker, message.heartbeat(), now, &effects);
        }
        break;
      }
      case v1::WorkerMessage::kStatus:
        // A status is also a sign of life.
        RETURN_IF_ERROR(membership_.Heartbeat(worker, Incarnation(message.incarnation()), now));
        result = jobs_.OnAssignmentStatus(worker, message.status(), now, &effects);
        break;
      case v1::WorkerMessage::kLeave: {
        std::optional<LostWorker> left = membership_.MarkLost(
            worker, Incarnation(message.incarnation()), LossReason::kLeft, now);
        if (left.has_value()) HandleLost({*left}, &effects);
        break;
      }
      case v1::WorkerMessage::kHello:
        return absl::FailedPreconditionError("Hello may only be the first message of a stream");
      default:
        return absl::InvalidArgumentError("WorkerMessage carries no heartbeat or status");
    }
    Collect(std::move(effects), &deliveries);
  }
  deliveries.Run().IgnoreError();  // logged; the writes stay queued
  if (message.kind_case() == v1::WorkerMessage::kHeartbeat) {
    metrics_->HeartbeatHandled(absl::Now() - arrived);
  }
  return result;
}

void Coordinator::Detach(const WorkerId& worker, Incarnation incarnation,
                         const WorkerSink* stream) {
  Deliveries deliveries;
  {
    SectionLock lock(this, LockSection::kDetach);
    const absl::Time now = clock_->Now();
    DiscountOwnStall(now);  // before anything can time out
    if (Superseded(worker, stream)) return;  // taken over: not a loss
    auto sink = sinks_.find(worker);
    if (sink != sinks_.end() && sink->second.incarnation == incarnation) sinks_.erase(sink);
    if (quiesced_) return;
    if (isolated_since_.has_value()) {
      // Cut off from everyone, a stream's end says nothing about its
      // worker (keepalives fail across the cut): it counts as silent, and
      // coming back (a take-over) or not is settled when the isolation ends.
      LOG(INFO) << "worker " << worker << "'s stream ended while the coordinator is cut off; "
                << "not counted as a loss yet";
      return;
    }
    std::optional<LostWorker> lost =
        membership_.MarkLost(worker, incarnation, LossReason::kStreamBroken, now);
    if (!lost.has_value()) return;
    Effects effects;
    HandleLost({*lost}, &effects);
    Collect(std::move(effects), &deliveries);
  }
  deliveries.Run().IgnoreError();  // logged; the writes stay queued
}

void Coordinator::Quiesce() {
  SectionLock lock(this, LockSection::kOther);
  quiesced_ = true;
}

void Coordinator::DiscountOwnStall(absl::Time now) {
  if (options_.stall_threshold <= absl::ZeroDuration() || !last_tick_.has_value() ||
      now - *last_tick_ <= options_.stall_threshold) {
    return;
  }
  const absl::Duration gap = now - *last_tick_;
  LOG(WARNING) << "the coordinator did not run for " << absl::FormatDuration(gap)
               << " (a stall of its own); heartbeat ages and job deadlines do not count it";
  membership_.Discount(gap, now);
  jobs_.Discount(gap, now);
  last_tick_ = now;
}

absl::Duration Coordinator::IsolationSilence() const {
  return std::max(options_.heartbeat_timeout / 2, 2 * options_.heartbeat_interval);
}

bool Coordinator::isolated() const {
  SectionLock lock(this, LockSection::kRead);
  return isolated_since_.has_value();
}

bool Coordinator::CheckIsolation(absl::Time now) {
  if (options_.isolation_limit <= absl::ZeroDuration()) return false;
  if (!isolated_since_.has_value()) {
    // Two workers at least: one silent worker is just that worker.
    const std::optional<absl::Time> newest = membership_.NewestHeartbeat(/*min_workers=*/2);
    if (!newest.has_value() || now - *newest <= IsolationSilence()) return false;
    isolated_since_ = now;
    last_heard_before_isolation_ = *newest;
    metrics_->SetIsolated(true);
    LOG(WARNING) << "no worker heard for " << absl::FormatDuration(now - *newest)
                 << ": the coordinator takes its own network to be cut and fences no one (for "
                 << "at most --isolation_limit " << absl::FormatDuration(options_.isolation_limit)
                 << ") until it hears from a worker again";
    return true;
  }
  const std::optional<absl::Time> newest = membership_.NewestHeartbeat(/*min_workers=*/1);
  const bool heard = newest.has_value() && *newest > last_heard_before_isolation_;
  const absl::Duration isolated_for = now - *isolated_since_;
  if (!heard && isolated_for <= options_.isolation_limit) return true;
  // Over: its time did not count against any job (as for a stall of its
  // own); workers still silent get --readopt_grace to re-attach, as after a
  // restart, or (past the limit) are fenced now.
  isolated_since_.reset();
  metrics_->SetIsolated(false);
  jobs_.Discount(isolated_for, now);
  if (heard) {
    membership_.ExcuseSilenceUntil(now + options_.readopt_grace);
    LOG(WARNING) << "heard from a worker again after " << absl::FormatDuration(isolated_for)
                 << " cut off; workers still silent have "
                 << absl::FormatDuration(options_.readopt_grace) << " to re-attach";
  } else {
    LOG(WARNING) << "no worker heard for " << absl::FormatDuration(isolated_for)
                 << " (--isolation_limit): fencing the silent workers";
  }
  return false;
}

void Coordinator::Tick() {
  Deliveries deliveries;
  {
    SectionLock lock(this, LockSection::kTick);
    if (quiesced_) return;
    const absl::Time now = clock_->Now();
    DiscountOwnStall(now);
    last_tick_ = now;
    Effects effects;
    if (!CheckIsolation(now)) {
      HandleLost(membership_.Expire(now), &effects);
      jobs_.Tick(now, &effects);
    }
    deliveries.kv = kv_.Expire(now);
    Collect(std::move(effects), &deliveries);
    if (deliveries.persist_through == 0 && persister_->has_queued()) {
      // Left by a failed batch: retried here when nothing else writes.
      deliveries.persister = persister_.get();
      deliveries.persist_through = persister_->last_ticket();
    }
    // Gauges scan every worker, so they refresh on the tick, not per message.
    UpdateGauges();
  }
  deliveries.Run().IgnoreError();  // logged; the writes stay queued
}

}  // namespace cohort::coordinator
