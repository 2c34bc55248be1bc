#include "worker/engine/communication_metrics.h"

#include <atomic>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/hub_communicator.h"
#include "worker/comm/tracked_communicator.h"

namespace cohort::worker {
namespace {

struct Call {
  comm::Collective collective;
  size_t bytes;
};

class Recorder : public comm::CollectiveObserver {
 public:
  void Observe(comm::Collective collective, size_t bytes, absl::Duration elapsed) override {
    EXPECT_GE(elapsed, absl::ZeroDuration());
    calls.push_back({collective, bytes});
  }
  std::vector<Call> calls;
};

TEST(TrackedCommunicatorTest, ReportsEveryCallWithItsBufferBytes) {
  testing::Hub hub;
  testing::HubCommunicator inner(&hub, 0, 4);
  std::atomic<int> in_flight{0};
  Recorder recorder;
  comm::TrackedCommunicator tracked(&inner, &in_flight, &recorder);
  std::vector<float> data(64);
  const absl::Duration t = absl::Seconds(1);
  (void)tracked.AllReduce(data.data(), 10, comm::DataType::kFloat32, comm::ReduceOp::kSum, t);
  (void)tracked.ReduceScatter(data.data(), data.data(), 3, comm::DataType::kFloat32,
                              comm::ReduceOp::kSum, t);
  (void)tracked.AllGather(data.data(), data.data(), 2, comm::DataType::kBFloat16, t);
  (void)tracked.Send(data.data(), 5, 1, 7, t);
  (void)tracked.Barrier(t);
  ASSERT_EQ(recorder.calls.size(), 5u);
  EXPECT_EQ(recorder.calls[0].collective, comm::Collective::kAllReduce);
  EXPECT_EQ(recorder.calls[0].bytes, 40u);
  EXPECT_EQ(recorder.calls[1].collective, comm::Collective::kReduceScatter);
  EXPECT_EQ(recorder.calls[1].bytes, 3u * 4 * 4);  // count_per_rank x size x 4 bytes
  EXPECT_EQ(recorder.calls[2].bytes, 2u * 4 * 2);
  EXPECT_EQ(recorder.calls[3].collective, comm::Collective::kSend);
  EXPECT_EQ(recorder.calls[3].bytes, 5u);
  EXPECT_EQ(recorder.calls[4].collective, comm::Collective::kBarrier);
  EXPECT_EQ(in_flight.load(), 0);
}

double Value(prometheus::Registry& registry, const std::string& name,
             const std::string& collective, const std::string& group) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string c, g;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "collective") c = label.value;
        if (label.name == "group") g = label.value;
      }
      if (c == collective && g == group) return metric.counter.value;
    }
  }
  return -1;
}

TEST(CommunicationMetricsTest, CountsSecondsBytesAndCallsPerGroup) {
  prometheus::Registry registry;
  CommunicationMetrics metrics(registry);
  // Every series exists before any call.
  EXPECT_EQ(Value(registry, "cohort_worker_collective_calls_total", "barrier", "pipeline"), 0);
  metrics.observer(MeshGroup::kData)
      ->Observe(comm::Collective::kAllReduce, 1000, absl::Milliseconds(250));
  metrics.observer(MeshGroup::kData)
      ->Observe(comm::Collective::kAllReduce, 24, absl::Milliseconds(250));
  metrics.observer(MeshGroup::kTensor)->Observe(comm::Collective::kAllGather, 8, absl::Seconds(1));
  EXPECT_EQ(Value(registry, "cohort_worker_collective_bytes_total", "allreduce", "data"), 1024);
  EXPECT_DOUBLE_EQ(Value(registry, "cohort_worker_collective_seconds_total", "allreduce", "data"),
                   0.5);
  EXPECT_EQ(Value(registry, "cohort_worker_collective_calls_total", "allreduce", "data"), 2);
  EXPECT_EQ(Value(registry, "cohort_worker_collective_calls_total", "allgather", "tensor"), 1);
  EXPECT_EQ(Value(registry, "cohort_worker_collective_calls_total", "allreduce", "tensor"), 0);
}

}  // namespace
}  // namespace cohort::worker
