#include "tools/sim/sim_report.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace cohort::sim {
namespace {

std::string Fixed(double value, int digits) { return absl::StrFormat("%.*f", digits, value); }

std::string OrDash(const std::optional<double>& value, int digits) {
  return value.has_value() ? Fixed(*value, digits) : "-";
}

std::string OrNull(const std::optional<double>& value, int digits) {
  return value.has_value() ? Fixed(*value, digits) : "null";
}

}  // namespace

std::optional<double> SimReport::coordinator_cpu_percent() const {
  if (!coordinator_cpu_seconds.has_value() || window_seconds <= 0) return std::nullopt;
  return *coordinator_cpu_seconds / window_seconds * 100.0;
}

std::string FormatTable(const SimReport& report) {
  const std::vector<std::string> header = {"workers",     "rate/s",    "attached",  "heartbeats",
                                           "hb_p50_ms",   "hb_p99_ms", "hb_max_ms", "coord_cpu_s",
                                           "coord_cpu_%", "errors"};
  const std::vector<std::string> row = {
      absl::StrCat(report.workers),
      Fixed(report.rate, report.rate == static_cast<int64_t>(report.rate) ? 0 : 2),
      absl::StrCat(report.attached),
      absl::StrCat(report.heartbeat.count),
      Fixed(report.heartbeat.p50_ms, 3),
      Fixed(report.heartbeat.p99_ms, 3),
      Fixed(report.heartbeat.max_ms, 3),
      OrDash(report.coordinator_cpu_seconds, 2),
      OrDash(report.coordinator_cpu_percent(), 1),
      absl::StrCat(report.errors())};
  // Each column as wide as its widest cell, right-aligned, two spaces apart.
  std::string header_line, row_line;
  for (size_t i = 0; i < header.size(); ++i) {
    const int width = static_cast<int>(std::max(header[i].size(), row[i].size()));
    const char* sep = i == 0 ? "" : "  ";
    absl::StrAppendFormat(&header_line, "%s%*s", sep, width, header[i]);
    absl::StrAppendFormat(&row_line, "%s%*s", sep, width, row[i]);
  }
  std::string out = absl::StrCat(header_line, "\n", row_line, "\n");
  absl::StrAppendFormat(&out, "attached %d/%d workers in %.3f s; window %.3f s\n", report.attached,
                        report.workers, report.attach_seconds, report.window_seconds);
  if (report.plan.has_value()) {
    absl::StrAppendFormat(
        &out, "mesh planning over %d workers (tp %d): median %.3f ms over %d runs\n",
        report.plan->workers, report.plan->tensor, report.plan->median_ms, report.plan->runs);
  }
  return out;
}

std::string FormatJson(const SimReport& report) {
  std::vector<std::string> fields = {
      absl::StrCat("\"workers\":", report.workers),
      absl::StrCat("\"rate\":", Fixed(report.rate, 3)),
      absl::StrCat("\"attached\":", report.attached),
      absl::StrCat("\"attach_seconds\":", Fixed(report.attach_seconds, 3)),
      absl::StrCat("\"window_seconds\":", Fixed(report.window_seconds, 3)),
      absl::StrCat("\"heartbeats\":", report.heartbeat.count),
      absl::StrCat("\"hb_p50_ms\":", Fixed(report.heartbeat.p50_ms, 3)),
      absl::StrCat("\"hb_p99_ms\":", Fixed(report.heartbeat.p99_ms, 3)),
      absl::StrCat("\"hb_max_ms\":", Fixed(report.heartbeat.max_ms, 3)),
      absl::StrCat("\"hb_mean_ms\":", Fixed(report.heartbeat.mean_ms, 3)),
      absl::StrCat("\"coord_cpu_s\":", OrNull(report.coordinator_cpu_seconds, 3)),
      absl::StrCat("\"coord_cpu_percent\":", OrNull(report.coordinator_cpu_percent(), 2)),
      absl::StrCat("\"unacked_heartbeats\":", report.unacked_heartbeats),
      absl::StrCat("\"stream_errors\":", report.stream_errors),
      absl::StrCat("\"errors\":", report.errors()),
      absl::StrCat("\"assignments\":", report.assignments),
  };
  if (report.plan.has_value()) {
    fields.push_back(absl::StrFormat(
        "\"plan\":{\"workers\":%d,\"tensor\":%d,\"runs\":%d,\"median_ms\":%.3f}",
        report.plan->workers, report.plan->tensor, report.plan->runs, report.plan->median_ms));
  } else {
    fields.push_back("\"plan\":null");
  }
  return absl::StrCat("{", absl::StrJoin(fields, ","), "}\n");
}

}  // namespace cohort::sim
