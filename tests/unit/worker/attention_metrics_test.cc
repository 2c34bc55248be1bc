// The attention implementation a GPU backend reported (attention_report.h)
// reaches the worker's metric cohort_worker_attention_implementation.

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "worker/agent/worker_metrics.h"
#include "worker/compute/attention_report.h"

namespace cohort::worker {
namespace {

using compute::AttentionChoice;
using compute::AttentionImplementation;

TEST(AttentionMetricsTest, TheLatestChoiceIsTheGaugeThatReadsOne) {
  WorkerMetrics metrics(std::make_shared<prometheus::Registry>());
  // Both 0 before any backend decided (this process has no GPU backend
  // unless an earlier test reported; only the latter half is then checked).
  if (!compute::LatestAttentionChoice().has_value()) {
    metrics.RefreshAttentionImplementation();
    EXPECT_EQ(metrics.attention_cudnn.Value(), 0.0);
    EXPECT_EQ(metrics.attention_kernels.Value(), 0.0);
  }
  compute::ReportAttentionChoice(
      AttentionChoice{.implementation = AttentionImplementation::kCudnn, .reason = "cuDNN 9.19.0"},
      /*fallback=*/false);
  metrics.RefreshAttentionImplementation();
  EXPECT_EQ(metrics.attention_cudnn.Value(), 1.0);
  EXPECT_EQ(metrics.attention_kernels.Value(), 0.0);
  compute::ReportAttentionChoice(
      AttentionChoice{.implementation = AttentionImplementation::kKernels,
                      .reason = "no cuDNN here"},
      /*fallback=*/true);
  metrics.RefreshAttentionImplementation();
  EXPECT_EQ(metrics.attention_cudnn.Value(), 0.0);
  EXPECT_EQ(metrics.attention_kernels.Value(), 1.0);
  const std::optional<AttentionChoice> latest = compute::LatestAttentionChoice();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->reason, "no cuDNN here");
  EXPECT_STREQ(compute::AttentionImplementationName(latest->implementation), "kernels");
}

}  // namespace
}  // namespace cohort::worker
