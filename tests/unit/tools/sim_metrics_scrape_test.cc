// cohort-sim's reading of the coordinator's /metrics text.

#include "tools/sim/metrics_scrape.h"

#include "gtest/gtest.h"

namespace cohort::sim {
namespace {

constexpr char kBefore[] = R"(# HELP cohort_worker_failures_detected_total Workers declared lost.
# TYPE cohort_worker_failures_detected_total counter
cohort_worker_failures_detected_total{kind="hang"} 0
cohort_worker_failures_detected_total{kind="stream_broken"} 2
cohort_worker_failures_detected_totally_other 7
cohort_coordinator_lock_hold_seconds_bucket{section="heartbeat",le="1e-06"} 0
cohort_coordinator_lock_hold_seconds_bucket{section="heartbeat",le="1e-05"} 10
cohort_coordinator_lock_hold_seconds_bucket{section="heartbeat",le="0.0001"} 10
cohort_coordinator_lock_hold_seconds_bucket{section="heartbeat",le="+Inf"} 10
cohort_coordinator_lock_hold_seconds_bucket{section="jobs",le="1e-06"} 0
cohort_coordinator_lock_hold_seconds_bucket{section="jobs",le="1e-05"} 0
cohort_coordinator_lock_hold_seconds_bucket{section="jobs",le="0.0001"} 0
cohort_coordinator_lock_hold_seconds_bucket{section="jobs",le="+Inf"} 0
)";

constexpr char kAfter[] = R"(cohort_worker_failures_detected_total{kind="hang"} 1
cohort_worker_failures_detected_total{kind="stream_broken"} 2
cohort_worker_failures_detected_totally_other 9
cohort_coordinator_lock_hold_seconds_bucket{section="heartbeat",le="1e-06"} 0
cohort_coordinator_lock_hold_seconds_bucket{section="heartbeat",le="1e-05"} 108
cohort_coordinator_lock_hold_seconds_bucket{section="heartbeat",le="0.0001"} 110
cohort_coordinator_lock_hold_seconds_bucket{section="heartbeat",le="+Inf"} 110
cohort_coordinator_lock_hold_seconds_bucket{section="jobs",le="1e-06"} 0
cohort_coordinator_lock_hold_seconds_bucket{section="jobs",le="1e-05"} 0
cohort_coordinator_lock_hold_seconds_bucket{section="jobs",le="0.0001"} 1
cohort_coordinator_lock_hold_seconds_bucket{section="jobs",le="+Inf"} 2
)";

TEST(MetricsScrapeTest, CountersSumTheirSeriesOnly) {
  const MetricsText before(kBefore);
  EXPECT_EQ(before.Sum("cohort_worker_failures_detected_total"), 2);
  EXPECT_EQ(before.Sum("cohort_nothing"), 0);
}

TEST(MetricsScrapeTest, QuantilesAreBucketBoundsOfWhatHappenedBetweenScrapes) {
  const MetricsText diff(DiffMetrics(kBefore, kAfter));
  EXPECT_EQ(diff.Sum("cohort_worker_failures_detected_total"), 1);
  // Between the scrapes: heartbeat 98 in <= 10 us and 2 in <= 100 us; jobs
  // 1 in <= 100 us and 1 above.
  const char* hold = "cohort_coordinator_lock_hold_seconds";
  EXPECT_EQ(diff.Quantile(hold, 0.5, "section=\"heartbeat\""), 1e-05);
  EXPECT_EQ(diff.Quantile(hold, 0.99, "section=\"heartbeat\""), 0.0001);
  EXPECT_EQ(diff.Quantile(hold, 0.5, "section=\"jobs\""), 0.0001);
  EXPECT_EQ(diff.Quantile(hold, 0.99, "section=\"jobs\""), std::numeric_limits<double>::infinity());
  // All sections: 98 of 102 by 10 us, 101 by 100 us.
  EXPECT_EQ(diff.Quantile(hold, 0.9), 1e-05);
  EXPECT_EQ(diff.Quantile(hold, 0.97), 0.0001);
  EXPECT_EQ(MetricsText(kBefore).Quantile(hold, 0.5, "section=\"jobs\""), std::nullopt);
}

}  // namespace
}  // namespace cohort::sim
