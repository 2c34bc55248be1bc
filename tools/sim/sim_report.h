#pragma once
// What one cohort-sim run measured, and its text and JSON renderings. Pure.

#include <cstdint>
#include <optional>
#include <string>

#include "tools/sim/latency_stats.h"

namespace cohort::sim {

struct PlanTiming {
  int workers = 0;
  int tensor = 0;
  int runs = 0;
  double median_ms = 0;
};

struct SimReport {
  int workers = 0;            // requested
  double rate = 0;            // heartbeats per second per worker
  int attached = 0;           // welcomed by the coordinator
  double attach_seconds = 0;  // from the first Hello to the last Welcome
  double window_seconds = 0;  // length of the measurement window
  LatencySummary heartbeat;   // acks of heartbeats sent in the window
  // Heartbeats sent in the window that got no ack, and streams that ended
  // while the run still needed them.
  int64_t unacked_heartbeats = 0;
  int64_t stream_errors = 0;
  // Statuses answered to Assign/Reconfigure/Stop (job planning exercised).
  int64_t assignments = 0;
  // Coordinator CPU over the window; absent without --coordinator_pid.
  std::optional<double> coordinator_cpu_seconds;
  std::optional<PlanTiming> plan;

  int64_t errors() const { return unacked_heartbeats + stream_errors; }
  // CPU % of one core; absent without coordinator_cpu_seconds.
  std::optional<double> coordinator_cpu_percent() const;
};

// Header line and one row:
//   workers  rate/s  attached  heartbeats  hb_p50_ms  hb_p99_ms  hb_max_ms  coord_cpu_s coord_cpu_%
//   errors
// then "attached A/N workers in S s; window W s", then "mesh planning over N workers (tp T): median
// X ms over R runs" when plan is set. Unknown values print as "-". Ends with a newline.
std::string FormatTable(const SimReport& report);

// One JSON object with every field (null for absent values), newline-terminated.
std::string FormatJson(const SimReport& report);

}  // namespace cohort::sim
