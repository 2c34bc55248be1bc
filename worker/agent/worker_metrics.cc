#include "worker/agent/worker_metrics.h"

#include "worker/compute/attention_report.h"
#include "worker/compute/capture_report.h"

namespace cohort::worker {
namespace {

prometheus::Gauge& NewGauge(prometheus::Registry& registry, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

constexpr char kAttentionName[] = "cohort_worker_attention_implementation";
constexpr char kAttentionHelp[] =
    "1 for the attention implementation the worker's GPU backend runs (cuDNN's fused attention "
    "or the backend's kernels), 0 for the other";

prometheus::Gauge& AttentionGauge(prometheus::Registry& registry, const char* implementation) {
  return prometheus::BuildGauge()
      .Name(kAttentionName)
      .Help(kAttentionHelp)
      .Register(registry)
      .Add({{"implementation", implementation}});
}

prometheus::Counter& NewCounter(prometheus::Registry& registry, const char* name,
                                const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

// Loopback round trips take well under a millisecond; a loaded coordinator
// across a network can take seconds. 0.25 ms .. ~4 s in factors of 2.
prometheus::Histogram::BucketBoundaries RttBuckets() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double b = 0.00025; b < 5.0; b *= 2) bounds.push_back(b);
  return bounds;
}

}  // namespace

WorkerMetrics::WorkerMetrics(std::shared_ptr<prometheus::Registry> registry)
    : attached(NewGauge(*registry, "cohort_worker_attached",
                        "1 while the worker holds a welcomed Attach stream to the coordinator")),
      heartbeats_sent(NewCounter(*registry, "cohort_worker_heartbeats_sent_total",
                                 "Heartbeats sent to the coordinator")),
      heartbeat_rtt(prometheus::BuildHistogram()
                        .Name("cohort_worker_heartbeat_rtt_seconds")
                        .Help("Time from sending a heartbeat to receiving its ack")
                        .Register(*registry)
                        .Add({}, RttBuckets())),
      reconnects(NewCounter(*registry, "cohort_worker_reconnects_total",
                            "Attach attempts after the first (stream broken or refused)")),
      assignment_generation(NewGauge(*registry, "cohort_worker_assignment_generation",
                                     "Generation of the held assignment, 0 when none")),
      resident_memory(NewGauge(*registry, "cohort_worker_resident_memory_bytes",
                               "Resident set size of the worker process")),
      step(NewGauge(*registry, "cohort_worker_step",
                    "Optimizer steps completed in the held assignment")),
      loss(NewGauge(*registry, "cohort_worker_loss",
                    "Training loss of the last step (mean over the global batch's tokens)")),
      tokens_per_second(NewGauge(*registry, "cohort_worker_tokens_per_second",
                                 "Tokens of the global batch per second of the last step")),
      tokens_per_second_average(
          NewGauge(*registry, "cohort_worker_tokens_per_second_average",
                   "Tokens of the global batch per second over the generation's last 20 steps")),
      step_time(NewGauge(*registry, "cohort_worker_step_seconds",
                         "Wall time of the last optimizer step")),
      warm_spare_memory(NewGauge(*registry, "cohort_worker_warm_spare_bytes",
                                 "Memory of the session a warm spare prepared ahead (estimate)")),
      attention_cudnn(AttentionGauge(*registry, "cudnn")),
      attention_kernels(AttentionGauge(*registry, "kernels")),
      cuda_graph_replays(
          NewCounter(*registry, "cohort_worker_cuda_graph_replays_total",
                     "Micro-batches whose forward and backward ran as a replayed CUDA graph")),
      cuda_graphs_in_use(
          NewGauge(*registry, "cohort_worker_cuda_graphs_in_use",
                   "1 while the latest micro-batch of a GPU step ran as a replayed CUDA graph")),
      registry_(std::move(registry)) {}

void WorkerMetrics::RefreshAttentionImplementation() {
  const std::optional<compute::AttentionChoice> choice = compute::LatestAttentionChoice();
  const bool cudnn =
      choice.has_value() && choice->implementation == compute::AttentionImplementation::kCudnn;
  attention_cudnn.Set(cudnn ? 1.0 : 0.0);
  attention_kernels.Set(choice.has_value() && !cudnn ? 1.0 : 0.0);
}

void WorkerMetrics::RefreshCudaGraphs() {
  const compute::CaptureStats stats = compute::LatestCaptureStats();
  // The process's count only grows: the counter takes what is new.
  const uint64_t counted = replays_counted_.exchange(stats.replays);
  if (stats.replays > counted) {
    cuda_graph_replays.Increment(static_cast<double>(stats.replays - counted));
  }
  cuda_graphs_in_use.Set(stats.in_use ? 1.0 : 0.0);
}

}  // namespace cohort::worker
