#include "coordinator/coordinator_metrics.h"

#include "absl/strings/ascii.h"
#include "common/enum_names.h"

namespace cohort::coordinator {
namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
      5, 10, 30, 60};
  return *buckets;
}

const prometheus::Histogram::BucketBoundaries& SilenceBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 10, 30};
  return *buckets;
}

// From 1 us: most sections of the facade are a few microseconds.
const prometheus::Histogram::BucketBoundaries& LockBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01,
      0.025, 0.05, 0.1, 0.25, 1};
  return *buckets;
}

// "JOB_STATE_RUNNING" -> "running".
std::string JobStateLabel(v1::JobState state) {
  return absl::AsciiStrToLower(ShortEnumName(state));
}

}  // namespace

const char* LockSectionName(LockSection section) {
  switch (section) {
    case LockSection::kAttach: return "attach";
    case LockSection::kHeartbeat: return "heartbeat";
    case LockSection::kStatus: return "status";
    case LockSection::kDetach: return "detach";
    case LockSection::kTick: return "tick";
    case LockSection::kJobs: return "jobs";
    case LockSection::kKeyValue: return "kv";
    case LockSection::kRead: return "read";
    case LockSection::kOther: return "other";
  }
  return "other";
}

CoordinatorMetrics::CoordinatorMetrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)) {
  heartbeats_ = &prometheus::BuildCounter()
                     .Name("cohort_heartbeats_received_total")
                     .Help("Worker heartbeats received.")
                     .Register(*registry_)
                     .Add({});
  auto& lock_wait = prometheus::BuildHistogram()
                        .Name("cohort_coordinator_lock_wait_seconds")
                        .Help("Time a critical section of the coordinator waited for its "
                              "mutex, by what the section was for.")
                        .Register(*registry_);
  auto& lock_hold = prometheus::BuildHistogram()
                        .Name("cohort_coordinator_lock_hold_seconds")
                        .Help("Time a critical section of the coordinator held its mutex (no "
                              "disk I/O happens under it), by what the section was for.")
                        .Register(*registry_);
  for (int i = 0; i < kLockSections; ++i) {
    const std::string section = LockSectionName(static_cast<LockSection>(i));
    lock_wait_[i] = &lock_wait.Add({{"section", section}}, LockBuckets());
    lock_hold_[i] = &lock_hold.Add({{"section", section}}, LockBuckets());
  }
  heartbeat_seconds_ = &prometheus::BuildHistogram()
                            .Name("cohort_coordinator_heartbeat_seconds")
                            .Help("Time to handle one worker heartbeat in the coordinator, "
                                  "lock wait included.")
                            .Register(*registry_)
                            .Add({}, LockBuckets());
  job_write_batches_ = &prometheus::BuildCounter()
                            .Name("cohort_coordinator_job_write_batches_total")
                            .Help("Synced batches of job records written (group commit).")
                            .Register(*registry_)
                            .Add({});
  job_write_records_ = &prometheus::BuildCounter()
                            .Name("cohort_coordinator_job_write_records_total")
                            .Help("Job records written by those batches.")
                            .Register(*registry_)
                            .Add({});
  job_write_seconds_ = &prometheus::BuildHistogram()
                            .Name("cohort_coordinator_job_write_seconds")
                            .Help("Time of one synced batch of job records.")
                            .Register(*registry_)
                            .Add({}, LatencyBuckets());
  failures_ = &prometheus::BuildCounter()
                   .Name("cohort_worker_failures_detected_total")
                   .Help("Workers declared lost, by how the loss was detected.")
                   .Register(*registry_);
  detection_silence_ = &prometheus::BuildHistogram()
                            .Name("cohort_failure_detection_silence_seconds")
                            .Help("Time since a lost worker's last heartbeat when its loss was "
                                  "detected, by detection kind.")
                            .Register(*registry_);
  generation_changes_ = &prometheus::BuildCounter()
                             .Name("cohort_generation_changes_total")
                             .Help("Mesh changes (new job generations) across all jobs.")
                             .Register(*registry_)
                             .Add({});
  departures_ = &prometheus::BuildCounter()
                     .Name("cohort_worker_departures_total")
                     .Help("Workers that left on purpose (shutdown or drain), not counted as "
                           "failures.")
                     .Register(*registry_)
                     .Add({});
  workers_ = &prometheus::BuildGauge()
                  .Name("cohort_workers")
                  .Help("Known workers by state.")
                  .Register(*registry_);
  jobs_ = &prometheus::BuildGauge().Name("cohort_jobs").Help("Jobs by state.").Register(*registry_);
  validation_loss_ = &prometheus::BuildGauge()
                          .Name("cohort_job_validation_loss")
                          .Help("The newest validation loss of each job (data.validation), "
                                "by job_id; kept until the job's record is deleted.")
                          .Register(*registry_);
  rpc_latency_ = &prometheus::BuildHistogram()
                      .Name("cohort_rpc_duration_seconds")
                      .Help("Latency of unary RPCs handled by the coordinator, by method and code.")
                      .Register(*registry_);
  rpc_rejected_ = &prometheus::BuildCounter()
                       .Name("cohort_rpc_rejected_total")
                       .Help("Calls refused before their handler ran (credentials, role, stream "
                             "limit), by method and code.")
                       .Register(*registry_);
  kv_ops_ = &prometheus::BuildCounter()
                 .Name("cohort_kv_operations_total")
                 .Help("KeyValue operations by kind.")
                 .Register(*registry_);
  attached_streams_ = &prometheus::BuildGauge()
                           .Name("cohort_attach_streams")
                           .Help("Open worker Attach streams.")
                           .Register(*registry_)
                           .Add({});
  stream_takeovers_ = &prometheus::BuildCounter()
                           .Name("cohort_attach_stream_takeovers_total")
                           .Help("Workers that attached again on a new stream while their old "
                                 "one still counted (the same process; re-adopted in place).")
                           .Register(*registry_)
                           .Add({});
  isolated_ = &prometheus::BuildGauge()
                   .Name("cohort_coordinator_isolated")
                   .Help("1 while the coordinator hears from no worker and takes its own network "
                         "to be cut (it fences no one meanwhile).")
                   .Register(*registry_)
                   .Add({});
  isolations_ = &prometheus::BuildCounter()
                     .Name("cohort_coordinator_isolations_total")
                     .Help("Times the coordinator took itself to be cut off from every worker.")
                     .Register(*registry_)
                     .Add({});
  recoveries_ = &prometheus::BuildCounter()
                    .Name("cohort_recoveries_total")
                    .Help("Re-planned generations that restored their state and ran, by where "
                          "the state came from: peer (survivors' memory), spare (peer, with a "
                          "spare in a lost worker's place), checkpoint, none (a fresh start)")
                    .Register(*registry_);
  recovery_seconds_ = &prometheus::BuildHistogram()
                          .Name("cohort_recovery_duration_seconds")
                          .Help("From noticing a membership change (loss, stall, drain, join, "
                                "scale) to the new generation running, by kind")
                          .Register(*registry_);
  recovery_phase_seconds_ =
      &prometheus::BuildHistogram()
           .Name("cohort_recovery_phase_seconds")
           .Help("Phases of recoveries: suspend (the change noticed to the next generation "
                 "planned), prepare (planned to every member ready: communicators, sessions, "
                 "state transfers), first_step (ready to the first completed step)")
           .Register(*registry_);
  lost_steps_ = &prometheus::BuildCounter()
                    .Name("cohort_recovery_lost_steps_total")
                    .Help("Optimizer steps given up by recoveries (steps since the checkpoint "
                          "a recovery resumed from), by kind")
                    .Register(*registry_);
  for (const char* kind : {"peer", "spare", "checkpoint", "none"}) {
    recoveries_->Add({{"kind", kind}});
    lost_steps_->Add({{"kind", kind}});
  }
  checkpoint_bytes_ = &prometheus::BuildCounter()
                          .Name("cohort_checkpoint_bytes_total")
                          .Help("Checkpoint chunk bytes received from writers (direction=upload) "
                                "and sent to readers (direction=download).")
                          .Register(*registry_);
  checkpoint_chunks_ = &prometheus::BuildCounter()
                           .Name("cohort_checkpoint_chunks_total")
                           .Help("Checkpoint chunks stored (upload) and sent (download).")
                           .Register(*registry_);
  checkpoint_streams_ = &prometheus::BuildGauge()
                            .Name("cohort_checkpoint_streams")
                            .Help("Open checkpoint Upload and Download streams.")
                            .Register(*registry_);
  checkpoint_commits_ = &prometheus::BuildCounter()
                            .Name("cohort_checkpoint_commits_total")
                            .Help("Checkpoints committed (made visible).")
                            .Register(*registry_)
                            .Add({});
  checkpoint_commit_seconds_ =
      &prometheus::BuildHistogram()
           .Name("cohort_checkpoint_commit_duration_seconds")
           .Help("Time from the last writer's UploadEnd to its reply: coverage check, flush of "
                 "the chunks, synced manifest write and retention.")
           .Register(*registry_)
           .Add({}, LatencyBuckets());
  checkpoint_abandoned_ = &prometheus::BuildCounter()
                              .Name("cohort_checkpoint_attempts_abandoned_total")
                              .Help("Checkpoint uploads abandoned before commit (stale generation, "
                                    "idle, superseded, incomplete coverage); their bytes are freed.")
                              .Register(*registry_)
                              .Add({});
  checkpoint_retired_ = &prometheus::BuildCounter()
                            .Name("cohort_checkpoints_retired_total")
                            .Help("Committed checkpoints deleted by the retention policy.")
                            .Register(*registry_)
                            .Add({});
  checkpoint_pending_ = &prometheus::BuildGauge()
                            .Name("cohort_checkpoint_attempts_pending")
                            .Help("Checkpoint uploads in progress (not yet committed).")
                            .Register(*registry_)
                            .Add({});
  checkpoint_stored_bytes_ = &prometheus::BuildGauge()
                                 .Name("cohort_checkpoint_store_bytes")
                                 .Help("Bytes of the checkpoint store's live files (SST and blob).")
                                 .Register(*registry_)
                                 .Add({});
  checkpoint_failures_ =
      &prometheus::BuildCounter()
           .Name("cohort_checkpoint_failures_total")
           .Help(
               "Checkpoint attempts that failed, each counted once, by reason: storage (the "
               "store refused a write, e.g. a full disk), incomplete (the chunks did not "
               "cover the tensors), abandoned (the writers went idle). Attempts given up "
               "because the job moved on are not counted.")
           .Register(*registry_);
  for (const char* reason : {"storage", "incomplete", "abandoned"}) {
    checkpoint_failures_->Add({{"reason", reason}});
  }
  for (const char* direction : {"upload", "download"}) {
    checkpoint_bytes_->Add({{"direction", direction}});
    checkpoint_chunks_->Add({{"direction", direction}});
    checkpoint_streams_->Add({{"direction", direction}});
  }
  // Pre-create the label sets so every series exists from the start.
  for (WorkerState state :
       {WorkerState::kIdle, WorkerState::kAssigned, WorkerState::kLost, WorkerState::kDraining}) {
    workers_->Add({{"state", WorkerStateName(state)}}).Set(0);
  }
  for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
    jobs_->Add({{"state", JobStateLabel(static_cast<v1::JobState>(s))}}).Set(0);
  }
  for (LossReason reason :
       {LossReason::kStreamBroken, LossReason::kHeartbeatTimeout, LossReason::kReplaced,
        LossReason::kHang}) {
    failures_->Add({{"kind", LossReasonName(reason)}});
  }
}

void CoordinatorMetrics::FailureDetected(LossReason reason, absl::Duration silence) {
  failures_->Add({{"kind", LossReasonName(reason)}}).Increment();
  detection_silence_->Add({{"kind", LossReasonName(reason)}}, SilenceBuckets())
      .Observe(absl::ToDoubleSeconds(silence));
}

void CoordinatorMetrics::SetWorkerCounts(const std::map<WorkerState, int>& counts) {
  for (WorkerState state :
       {WorkerState::kIdle, WorkerState::kAssigned, WorkerState::kLost, WorkerState::kDraining}) {
    auto it = counts.find(state);
    workers_->Add({{"state", WorkerStateName(state)}}).Set(it == counts.end() ? 0 : it->second);
  }
}

void CoordinatorMetrics::SetJobCounts(const std::map<v1::JobState, int>& counts) {
  for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
    auto it = counts.find(static_cast<v1::JobState>(s));
    jobs_->Add({{"state", JobStateLabel(static_cast<v1::JobState>(s))}})
        .Set(it == counts.end() ? 0 : it->second);
  }
}

void CoordinatorMetrics::SetValidationLosses(const std::map<std::string, double>& losses) {
  for (auto it = validation_gauges_.begin(); it != validation_gauges_.end();) {
    if (!losses.contains(it->first)) {
      validation_loss_->Remove(it->second);
      it = validation_gauges_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [job, loss] : losses) {
    prometheus::Gauge*& gauge = validation_gauges_[job];
    if (gauge == nullptr) gauge = &validation_loss_->Add({{"job_id", job}});
    gauge->Set(loss);
  }
}

void CoordinatorMetrics::ObserveRpc(const std::string& method, const std::string& code,
                                    absl::Duration latency) {
  rpc_latency_->Add({{"method", method}, {"code", code}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(latency));
}

void CoordinatorMetrics::RpcRejected(const std::string& method, const std::string& code) {
  rpc_rejected_->Add({{"method", method}, {"code", code}}).Increment();
}

void CoordinatorMetrics::RecoveryPhase(const char* phase, absl::Duration took) {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300};
  recovery_phase_seconds_->Add({{"phase", phase}}, *buckets).Observe(absl::ToDoubleSeconds(took));
}

void CoordinatorMetrics::RecoveryCompleted(v1::RecoveryKind kind, bool spare, int64_t lost_steps,
                                           absl::Duration detect_to_running) {
  const char* label = kind == v1::RECOVERY_KIND_PEER         ? (spare ? "spare" : "peer")
                      : kind == v1::RECOVERY_KIND_CHECKPOINT ? "checkpoint"
                                                             : "none";
  recoveries_->Add({{"kind", label}}).Increment();
  lost_steps_->Add({{"kind", label}}).Increment(static_cast<double>(lost_steps));
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300};
  recovery_seconds_->Add({{"kind", label}}, *buckets)
      .Observe(absl::ToDoubleSeconds(detect_to_running));
}

void CoordinatorMetrics::CheckpointTransfer(const std::string& direction, int64_t bytes) {
  checkpoint_bytes_->Add({{"direction", direction}}).Increment(static_cast<double>(bytes));
  checkpoint_chunks_->Add({{"direction", direction}}).Increment();
}

void CoordinatorMetrics::SetCheckpointStreams(const std::string& direction, int n) {
  checkpoint_streams_->Add({{"direction", direction}}).Set(n);
}

void CoordinatorMetrics::CheckpointFailed(v1::CheckpointFailureKind kind) {
  // The label is the kind's name in lower case ("storage"); an unexpected
  // kind gets its own series rather than hiding in another's.
  checkpoint_failures_->Add({{"reason", absl::AsciiStrToLower(ShortEnumName(kind))}}).Increment();
}

void CoordinatorMetrics::CheckpointCommitted(absl::Duration duration) {
  checkpoint_commits_->Increment();
  checkpoint_commit_seconds_->Observe(absl::ToDoubleSeconds(duration));
}

}  // namespace cohort::coordinator
