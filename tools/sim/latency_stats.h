#pragma once
// Percentiles over recorded round-trip times. Pure functions.

#include <cstdint>
#include <vector>

namespace cohort::sim {

struct LatencySummary {
  int64_t count = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
  double mean_ms = 0;
};

// Nearest-rank percentile of ascending `sorted` for q in [0, 1]: the smallest
// sample with at least q * n samples at or below it. 0 for an empty vector.
double Percentile(const std::vector<double>& sorted, double q);

// Summary of `samples_ms` in any order (all zeros for no samples).
LatencySummary SummarizeLatencies(std::vector<double> samples_ms);

}  // namespace cohort::sim
