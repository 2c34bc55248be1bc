#include "worker/compute/capture_report.h"

#include <atomic>

namespace cohort::compute {
namespace {

std::atomic<uint64_t> replays{0};
std::atomic<bool> in_use{false};

}  // namespace

void ReportCaptureRun(bool replayed) {
  if (replayed) replays.fetch_add(1, std::memory_order_relaxed);
  in_use.store(replayed, std::memory_order_relaxed);
}

CaptureStats LatestCaptureStats() {
  return CaptureStats{.replays = replays.load(std::memory_order_relaxed),
                      .in_use = in_use.load(std::memory_order_relaxed)};
}

}  // namespace cohort::compute
