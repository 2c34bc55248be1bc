#pragma once
// The process's captured replays (Backend::Replay through CaptureCache): how
// many ran, and whether the latest captured unit ran as a replay; read by
// the worker's metrics (cohort_worker_cuda_graph_replays_total,
// cohort_worker_cuda_graphs_in_use; docs/metrics.md). Process-wide, like
// attention_report.h.
//
// Thread-safe.

#include <cstdint>

namespace cohort::compute {

struct CaptureStats {
  uint64_t replays = 0;  // since the process started
  bool in_use = false;   // the latest unit a CaptureCache ran was a replay
};

// A unit ran: replayed (`replayed`), or its ops issued directly.
void ReportCaptureRun(bool replayed);
CaptureStats LatestCaptureStats();

}  // namespace cohort::compute
