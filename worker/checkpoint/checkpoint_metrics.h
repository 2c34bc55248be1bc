#pragma once
// The worker's checkpoint and peer-recovery metrics (cohort_worker_checkpoint_*,
// cohort_worker_peer_*; catalogue in docs/metrics.md). Thread-safe
// (prometheus-cpp metrics are).

#include <memory>

#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/checkpoint/checkpoint_writer.h"

namespace cohort::checkpoint {

class CheckpointMetrics {
 public:
  explicit CheckpointMetrics(std::shared_ptr<prometheus::Registry> registry);

  // The step loop was blocked for `stall` to take a snapshot.
  void Saved(absl::Duration stall);
  // A background upload ended.
  void Uploaded(const UploadResult& result);
  // State was restored from a checkpoint.
  void Restored(uint64_t bytes, absl::Duration duration);
  // A peer recovery's transfers ended on this worker (as a member or donor).
  void PeerTransferred(int64_t sent_bytes, int64_t received_bytes, absl::Duration duration);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* stall_;
  prometheus::Histogram* upload_seconds_;
  prometheus::Histogram* restore_seconds_;
  prometheus::Family<prometheus::Counter>* bytes_;
  prometheus::Family<prometheus::Counter>* uploads_;
  prometheus::Counter* restores_;
  prometheus::Gauge* last_step_;
  prometheus::Histogram* peer_seconds_;
  prometheus::Family<prometheus::Counter>* peer_bytes_;
  prometheus::Counter* peer_restores_;
};

}  // namespace cohort::checkpoint
