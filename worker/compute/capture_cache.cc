#include "worker/compute/capture_cache.h"

#include <utility>

#include "common/log.h"
#include "common/status_macros.h"
#include "worker/compute/capture_report.h"

namespace cohort::compute {

CaptureCache::CaptureCache(Backend* backend, bool enabled, std::string what)
    : backend_(backend), active_(enabled && backend->SupportsCapture()), what_(std::move(what)) {}

absl::Status CaptureCache::Direct(absl::FunctionRef<absl::Status()> ops) {
  ReportCaptureRun(/*replayed=*/false);
  return ops();
}

absl::Status CaptureCache::Run(const CaptureKey& key, absl::FunctionRef<absl::Status()> ops) {
  if (!active_) return Direct(ops);
  Entry& entry = entries_[key];
  if (entry.direct_only) return Direct(ops);
  if (entry.captured != nullptr) {
    const absl::Status replayed = backend_->Replay(*entry.captured);
    if (replayed.ok()) {
      ++replays_;
      ReportCaptureRun(/*replayed=*/true);
      return absl::OkStatus();
    }
    // Stale (backend.h, Replay): nothing ran. Warm up and capture afresh.
    entry.captured.reset();
    entry.warmed = false;
  }
  if (!entry.warmed) {
    entry.warmed = true;
    return Direct(ops);
  }
  ASSIGN_OR_RETURN(const bool replayed, CaptureAndReplay(entry, ops));
  if (replayed) return absl::OkStatus();
  return Direct(ops);
}

absl::StatusOr<bool> CaptureCache::CaptureAndReplay(Entry& entry,
                                                    absl::FunctionRef<absl::Status()> ops) {
  // A failure pending from earlier ops refuses the capture; the ops then run
  // directly and that failure reaches the next Synchronize as it would have.
  if (!backend_->BeginCapture().ok()) return false;
  const absl::Status issued = ops();
  absl::StatusOr<std::unique_ptr<CapturedOps>> captured = backend_->EndCapture();
  if (!captured.ok()) {
    ++failed_captures_;
    entry.direct_only = true;
    if (!failure_logged_) {
      failure_logged_ = true;
      LOG(WARNING) << "CUDA graphs: capturing " << what_ << " on the " << backend_->name()
                   << " backend failed (" << captured.status()
                   << "); its ops run directly, launch by launch";
    }
    return false;
  }
  RETURN_IF_ERROR(issued);  // stopped early (a cancel): the capture is dropped
  ++captures_;
  entry.captured = *std::move(captured);
  // A capture runs nothing: its first replay is this run.
  if (!backend_->Replay(*entry.captured).ok()) {
    entry.captured.reset();
    return false;
  }
  ++replays_;
  ReportCaptureRun(/*replayed=*/true);
  return true;
}

}  // namespace cohort::compute
