#include "tools/sim/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cohort::sim {

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  // Rank 1..n; q = 0 gives the minimum.
  const double rank = std::ceil(q * static_cast<double>(sorted.size()));
  const size_t index = rank <= 1 ? 0 : static_cast<size_t>(rank) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

LatencySummary SummarizeLatencies(std::vector<double> samples_ms) {
  LatencySummary summary;
  if (samples_ms.empty()) return summary;
  std::sort(samples_ms.begin(), samples_ms.end());
  summary.count = static_cast<int64_t>(samples_ms.size());
  summary.p50_ms = Percentile(samples_ms, 0.50);
  summary.p99_ms = Percentile(samples_ms, 0.99);
  summary.max_ms = samples_ms.back();
  summary.mean_ms = std::accumulate(samples_ms.begin(), samples_ms.end(), 0.0) /
                    static_cast<double>(samples_ms.size());
  return summary;
}

}  // namespace cohort::sim
