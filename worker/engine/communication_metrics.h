#pragma once
// CommunicationMetrics: the worker's time and bytes in collectives, by kind
// of call and mesh axis (docs/metrics.md):
//   cohort_worker_collective_seconds_total{collective, group}
//   cohort_worker_collective_bytes_total{collective, group}
//   cohort_worker_collective_calls_total{collective, group}
//   cohort_worker_collective_watchdog_aborts_total{collective, group}
// group is data, tensor or pipeline; collective as comm::CollectiveName.
// Every series exists from start-up at 0, so rates are defined before the
// first job.
//
// Thread-safe (prometheus-cpp counters are atomic).

#include <array>
#include <memory>

#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "worker/comm/tracked_communicator.h"

namespace cohort::worker {

enum class MeshGroup { kData, kTensor, kPipeline };
// "data", "tensor", "pipeline" (the group label; the call watchdog's reasons).
inline const char* MeshGroupName(MeshGroup group) {
  constexpr const char* kNames[] = {"data", "tensor", "pipeline"};
  return kNames[static_cast<int>(group)];
}

class CommunicationMetrics {
 public:
  explicit CommunicationMetrics(prometheus::Registry& registry);

  // The observer for one group's communicator; lives as long as this.
  comm::CollectiveObserver* observer(MeshGroup group) { return &groups_[static_cast<int>(group)]; }

 private:
  class Group final : public comm::CollectiveObserver {
   public:
    void Observe(comm::Collective collective, size_t bytes, absl::Duration elapsed) override;
    void WatchdogAborted(comm::Collective collective) override;

    struct Series {
      prometheus::Counter* seconds = nullptr;
      prometheus::Counter* bytes = nullptr;
      prometheus::Counter* calls = nullptr;
      prometheus::Counter* watchdog_aborts = nullptr;
    };
    std::array<Series, comm::kCollectiveKinds> series;
  };
  std::array<Group, 3> groups_;
};

}  // namespace cohort::worker
