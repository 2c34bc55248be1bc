#pragma once
// Reading a coordinator's Prometheus /metrics from cohort-sim: a plain
// HTTP/1.0 GET and the text exposition format's counters and histograms.

#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cohort::sim {

// The body of http://`address`/metrics (host:port). Unavailable when the
// connection fails, DeadlineExceeded past `timeout`.
absl::StatusOr<std::string> FetchMetrics(const std::string& address, absl::Duration timeout);

// Parsed samples: series (name plus labels, as written) -> value.
class MetricsText {
 public:
  explicit MetricsText(absl::string_view text);
  // The sum of every series of `name` (a counter's or gauge's total).
  double Sum(absl::string_view name) const;
  // The q-quantile (0 < q <= 1) of histogram `name` over its series whose
  // labels contain `label_filter` (e.g. "section=\"heartbeat\""; "" for
  // all), as the upper bound of the bucket where the cumulative count
  // reaches q of the total; nullopt without observations.
  std::optional<double> Quantile(absl::string_view name, double q,
                                 absl::string_view label_filter = "") const;

 private:
  std::map<std::string, double> samples_;
};

// Counts and cumulative bucket counts of `after` minus `before`: what
// happened between two scrapes (histograms subtract bucket by bucket).
std::string DiffMetrics(absl::string_view before, absl::string_view after);

}  // namespace cohort::sim
