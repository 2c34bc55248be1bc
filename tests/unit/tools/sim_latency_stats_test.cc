#include <vector>

#include "gtest/gtest.h"
#include "tools/sim/latency_stats.h"

namespace cohort::sim {
namespace {

TEST(PercentileTest, NearestRank) {
  const std::vector<double> sorted = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(Percentile(sorted, 0.0), 1);
  EXPECT_EQ(Percentile(sorted, 0.1), 1);
  EXPECT_EQ(Percentile(sorted, 0.11), 2);
  EXPECT_EQ(Percentile(sorted, 0.5), 5);
  EXPECT_EQ(Percentile(sorted, 0.99), 10);
  EXPECT_EQ(Percentile(sorted, 1.0), 10);
  EXPECT_EQ(Percentile(sorted, 7.0), 10);  // clamped
}

TEST(PercentileTest, EmptyIsZero) { EXPECT_EQ(Percentile({}, 0.5), 0); }

TEST(PercentileTest, OddCountMedianIsMiddle) {
  EXPECT_EQ(Percentile({3, 5, 100}, 0.5), 5);
  EXPECT_EQ(Percentile({1, 2, 3, 4, 5}, 0.5), 3);
}

TEST(SummarizeLatenciesTest, UnsortedInput) {
  std::vector<double> samples;
  // 1..1000 in scrambled order.
  for (int i = 0; i < 1000; ++i) samples.push_back(static_cast<double>((i * 617) % 1000 + 1));
  LatencySummary s = SummarizeLatencies(samples);
  EXPECT_EQ(s.count, 1000);
  EXPECT_EQ(s.p50_ms, 500);
  EXPECT_EQ(s.p99_ms, 990);
  EXPECT_EQ(s.max_ms, 1000);
  EXPECT_DOUBLE_EQ(s.mean_ms, 500.5);
}

TEST(SummarizeLatenciesTest, NoSamples) {
  LatencySummary s = SummarizeLatencies({});
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(s.p50_ms, 0);
  EXPECT_EQ(s.max_ms, 0);
}

TEST(SummarizeLatenciesTest, OutlierShowsInP99AndMaxOnly) {
  std::vector<double> samples(99, 1.0);
  samples.push_back(250.0);
  LatencySummary s = SummarizeLatencies(samples);
  EXPECT_EQ(s.p50_ms, 1.0);
  EXPECT_EQ(s.p99_ms, 1.0);
  EXPECT_EQ(s.max_ms, 250.0);
}

}  // namespace
}  // namespace cohort::sim
