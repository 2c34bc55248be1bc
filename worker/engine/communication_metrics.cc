#include "worker/engine/communication_metrics.h"

namespace cohort::worker {

CommunicationMetrics::CommunicationMetrics(prometheus::Registry& registry) {
  auto& seconds = prometheus::BuildCounter()
                      .Name("cohort_worker_collective_seconds_total")
                      .Help(
                          "Wall time spent in collective and point-to-point calls, by call and "
                          "mesh axis (waiting for peers included).")
                      .Register(registry);
  auto& bytes = prometheus::BuildCounter()
                    .Name("cohort_worker_collective_bytes_total")
                    .Help(
                        "Bytes of the buffers passed to collective and point-to-point calls, "
                        "by call and mesh axis.")
                    .Register(registry);
  auto& calls = prometheus::BuildCounter()
                    .Name("cohort_worker_collective_calls_total")
                    .Help("Collective and point-to-point calls, by call and mesh axis.")
                    .Register(registry);
  auto& watchdog_aborts =
      prometheus::BuildCounter()
          .Name("cohort_worker_collective_watchdog_aborts_total")
          .Help(
              "Calls the call watchdog aborted because they ran past their timeout plus "
              "--collective_watchdog_grace (each also aborts its generation's "
              "communicators), by call and mesh axis.")
          .Register(registry);
  for (int g = 0; g < 3; ++g) {
    for (int c = 0; c < comm::kCollectiveKinds; ++c) {
      const prometheus::Labels labels{
          {"collective", comm::CollectiveName(static_cast<comm::Collective>(c))},
          {"group", MeshGroupName(static_cast<MeshGroup>(g))}};
      groups_[g].series[c] = {&seconds.Add(labels), &bytes.Add(labels), &calls.Add(labels),
                              &watchdog_aborts.Add(labels)};
    }
  }
}

void CommunicationMetrics::Group::Observe(comm::Collective collective, size_t bytes,
                                          absl::Duration elapsed) {
  const Series& s = series[static_cast<int>(collective)];
  s.seconds->Increment(absl::ToDoubleSeconds(elapsed));
  s.bytes->Increment(static_cast<double>(bytes));
  s.calls->Increment();
}

void CommunicationMetrics::Group::WatchdogAborted(comm::Collective collective) {
  series[static_cast<int>(collective)].watchdog_aborts->Increment();
}

}  // namespace cohort::worker
