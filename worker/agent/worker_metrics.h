#pragma once
// The worker's Prometheus metrics (cohort_worker_*), registered once in a
// registry that the daemon serves at /metrics.

#include <atomic>
#include <cstdint>
#include <memory>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace cohort::worker {

// Thread-safe (prometheus-cpp metrics are). The referenced metrics live as
// long as the registry, which this object keeps alive.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(std::shared_ptr<prometheus::Registry> registry);

  prometheus::Gauge& attached;               // 1 while a Welcomed stream is open
  prometheus::Counter& heartbeats_sent;      // heartbeats written to a stream
  prometheus::Histogram& heartbeat_rtt;      // heartbeat -> ack, seconds
  prometheus::Counter& reconnects;           // attach attempts after the first
  prometheus::Gauge& assignment_generation;  // held generation, 0 when none
  prometheus::Gauge& resident_memory;        // RSS bytes, refreshed per heartbeat
  prometheus::Gauge& step;                   // trainer's step of the held job
  prometheus::Gauge& loss;                   // loss of the last step
  prometheus::Gauge& tokens_per_second;      // global-batch tokens / step time
  prometheus::Gauge& tokens_per_second_average;  // over the generation's last 20 steps
  prometheus::Gauge& step_time;              // seconds of the last step
  prometheus::Gauge& warm_spare_memory;      // bytes of a warm spare's prepared session
  // 1 for the attention implementation the GPU backend runs, 0 for the other
  // (label implementation = cudnn | kernels); both 0 until a GPU backend
  // decided. Refreshed per heartbeat (compute::LatestAttentionChoice).
  prometheus::Gauge& attention_cudnn;
  prometheus::Gauge& attention_kernels;
  void RefreshAttentionImplementation();
  // The device-resident step's CUDA graphs (compute/capture_report.h):
  // micro-batches replayed from a captured graph since the worker started,
  // and 1 while the latest micro-batch was a replay. Refreshed per heartbeat.
  prometheus::Counter& cuda_graph_replays;
  prometheus::Gauge& cuda_graphs_in_use;
  void RefreshCudaGraphs();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::atomic<uint64_t> replays_counted_{0};  // of the process's replays
};

}  // namespace cohort::worker
