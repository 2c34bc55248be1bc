#pragma once
// Prometheus metrics of the coordinator (catalogue: docs/metrics.md).
// Thread-safe (prometheus-cpp metrics are atomic).

#include <map>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "cohort/v1/job.pb.h"
#include "coordinator/membership/membership_table.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace cohort::coordinator {

// What a critical section of the coordinator's facade was for (a label of
// the lock metrics).
enum class LockSection { kAttach, kHeartbeat, kStatus, kDetach, kTick, kJobs, kKeyValue, kRead,
                         kOther };
inline constexpr int kLockSections = 9;
const char* LockSectionName(LockSection section);

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(std::shared_ptr<prometheus::Registry> registry);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void HeartbeatReceived() { heartbeats_->Increment(); }
  // One critical section: how long it waited for the facade's mutex and
  // how long it held it.
  void LockSectionTimed(LockSection section, absl::Duration waited, absl::Duration held) {
    lock_wait_[static_cast<int>(section)]->Observe(absl::ToDoubleSeconds(waited));
    lock_hold_[static_cast<int>(section)]->Observe(absl::ToDoubleSeconds(held));
  }
  // A heartbeat's handling, from arrival at the facade to its ack queued.
  void HeartbeatHandled(absl::Duration latency) {
    heartbeat_seconds_->Observe(absl::ToDoubleSeconds(latency));
  }
  // Job records written by one synced batch (group commit).
  void JobRecordsWritten(int64_t records, absl::Duration took) {
    job_write_batches_->Increment();
    job_write_records_->Increment(static_cast<double>(records));
    job_write_seconds_->Observe(absl::ToDoubleSeconds(took));
  }
  // `silence` is how long the worker had been quiet when the loss was detected.
  void FailureDetected(LossReason reason, absl::Duration silence);
  void GenerationChanged() { generation_changes_->Increment(); }
  // A re-planned generation became RUNNING with its state restored.
  void RecoveryCompleted(v1::RecoveryKind kind, bool spare, int64_t lost_steps,
                         absl::Duration detect_to_running);
  // One phase of a recovery ("suspend", "prepare", "first_step": RecoveryStats).
  void RecoveryPhase(const char* phase, absl::Duration took);
  // A worker announced its departure (Leave): not a failure.
  void WorkerLeft() { departures_->Increment(); }
  void SetWorkerCounts(const std::map<WorkerState, int>& counts);
  void SetJobCounts(const std::map<v1::JobState, int>& counts);
  // cohort_job_validation_loss{job}: one series per job in `losses` (job id
  // -> newest validation loss); series of jobs no longer there go.
  void SetValidationLosses(const std::map<std::string, double>& losses);
  // Latency of a unary RPC by method and gRPC status code name.
  void ObserveRpc(const std::string& method, const std::string& code, absl::Duration latency);
  // A call refused before its handler ran: unauthenticated, permission
  // denied, or over the per-client stream limit (`code` as for ObserveRpc).
  void RpcRejected(const std::string& method, const std::string& code);
  void KvOperation(const std::string& op) { kv_ops_->Add({{"op", op}}).Increment(); }
  void SetAttachedStreams(int n) { attached_streams_->Set(n); }
  // A live worker attached again on a new stream (the same process).
  void StreamTakenOver() { stream_takeovers_->Increment(); }
  // Entering (true) or leaving the coordinator's own isolation.
  void SetIsolated(bool isolated) {
    isolated_->Set(isolated ? 1 : 0);
    if (isolated) isolations_->Increment();
  }

  // --- Checkpoints ---
  // Chunk bytes received ("upload") or sent ("download").
  void CheckpointTransfer(const std::string& direction, int64_t bytes);
  void SetCheckpointStreams(const std::string& direction, int n);
  // The last writer's End took `duration` (coverage check, flush, synced
  // manifest write, retention).
  void CheckpointCommitted(absl::Duration duration);
  // Attempts abandoned and checkpoints retired since the last call.
  void CheckpointsAbandoned(int64_t n) { checkpoint_abandoned_->Increment(static_cast<double>(n)); }
  void CheckpointsRetired(int64_t n) { checkpoint_retired_->Increment(static_cast<double>(n)); }
  void SetCheckpointPending(int n) { checkpoint_pending_->Set(n); }
  // A checkpoint attempt failed (CheckpointUploads: STORAGE, INCOMPLETE or
  // ABANDONED): cohort_checkpoint_failures_total{reason="storage"...}.
  void CheckpointFailed(v1::CheckpointFailureKind kind);
  void SetCheckpointStoredBytes(uint64_t bytes) {
    checkpoint_stored_bytes_->Set(static_cast<double>(bytes));
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* heartbeats_;
  prometheus::Histogram* lock_wait_[kLockSections];
  prometheus::Histogram* lock_hold_[kLockSections];
  prometheus::Histogram* heartbeat_seconds_;
  prometheus::Counter* job_write_batches_;
  prometheus::Counter* job_write_records_;
  prometheus::Histogram* job_write_seconds_;
  prometheus::Family<prometheus::Counter>* failures_;
  prometheus::Family<prometheus::Histogram>* detection_silence_;
  prometheus::Counter* generation_changes_;
  prometheus::Counter* departures_;
  prometheus::Family<prometheus::Gauge>* workers_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Family<prometheus::Gauge>* validation_loss_;
  std::map<std::string, prometheus::Gauge*> validation_gauges_;  // by job id
  prometheus::Family<prometheus::Histogram>* rpc_latency_;
  prometheus::Family<prometheus::Counter>* kv_ops_;
  prometheus::Family<prometheus::Counter>* rpc_rejected_;
  prometheus::Gauge* attached_streams_;
  prometheus::Counter* stream_takeovers_;
  prometheus::Gauge* isolated_;
  prometheus::Counter* isolations_;
  prometheus::Family<prometheus::Counter>* recoveries_;
  prometheus::Family<prometheus::Histogram>* recovery_seconds_;
  prometheus::Family<prometheus::Histogram>* recovery_phase_seconds_;
  prometheus::Family<prometheus::Counter>* lost_steps_;
  prometheus::Family<prometheus::Counter>* checkpoint_bytes_;
  prometheus::Family<prometheus::Counter>* checkpoint_chunks_;
  prometheus::Family<prometheus::Gauge>* checkpoint_streams_;
  prometheus::Counter* checkpoint_commits_;
  prometheus::Histogram* checkpoint_commit_seconds_;
  prometheus::Counter* checkpoint_abandoned_;
  prometheus::Family<prometheus::Counter>* checkpoint_failures_;
  prometheus::Counter* checkpoint_retired_;
  prometheus::Gauge* checkpoint_pending_;
  prometheus::Gauge* checkpoint_stored_bytes_;
};

}  // namespace cohort::coordinator
