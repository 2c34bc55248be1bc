#pragma once
// CaptureCache: runs a unit of backend ops (a micro-batch's forward and
// backward) as a captured replay where the backend captures (backend.h,
// "Captured op sequences"), one capture per key. The key names everything
// the unit's ops bake in that the caller may change between runs (the
// shapes, the buffers' addresses); what the caller writes into those
// buffers between runs is read at replay time and is not part of it.
//
// Per key: the first run issues the ops directly (warm-up: a GPU backend
// plans its GEMMs and attention and grows its scratch there, which a
// capture may not); the second captures them and replays the capture (a
// capture runs nothing); later runs replay. A capture that fails (a call the
// capture forbids, the device's refusal) is logged once per cache and the
// key's ops run directly from then on; a capture the backend calls stale
// (its own memory moved) is dropped, and the key warms up and captures
// again. Off (`enabled` false) or on a backend that does not capture, every
// run issues its ops directly. Every run is reported to capture_report.h.
//
// The unit `ops` issues only what a capture may hold, every time it runs,
// the same way for the same key; it returns an error to stop early (a
// cancel), which is returned (a capture it was recorded into is dropped).
//
// Thread-compatible, like its Backend, which must outlive it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "worker/compute/backend.h"

namespace cohort::compute {

using CaptureKey = std::vector<uint64_t>;

class CaptureCache {
 public:
  // `what` names the unit in the log ("a micro-batch's forward and backward").
  CaptureCache(Backend* backend, bool enabled, std::string what);
  CaptureCache(const CaptureCache&) = delete;
  CaptureCache& operator=(const CaptureCache&) = delete;

  // Runs `ops` for `key` as above. Errors: `ops`'s own (a replay has none:
  // its ops' failures are pending on the backend, for Synchronize).
  absl::Status Run(const CaptureKey& key, absl::FunctionRef<absl::Status()> ops);
  // Drops every capture (the caller is about to free or move memory they
  // read); keys warm up again.
  void Clear() { entries_.clear(); }

  // Whether runs may replay at all (enabled, and the backend captures).
  bool active() const { return active_; }
  // Since creation: replays run, captures made, captures that failed.
  size_t replays() const { return replays_; }
  size_t captures() const { return captures_; }
  size_t failed_captures() const { return failed_captures_; }

 private:
  struct Entry {
    bool warmed = false;       // ran directly once since (re)starting
    bool direct_only = false;  // its capture failed: never again
    std::unique_ptr<CapturedOps> captured;
  };

  // Captures `ops` into `entry` and replays it; false (nothing run, the
  // capture thrown away) when the capture failed, which marks the entry.
  absl::StatusOr<bool> CaptureAndReplay(Entry& entry, absl::FunctionRef<absl::Status()> ops);
  // Issues `ops` directly (reported).
  absl::Status Direct(absl::FunctionRef<absl::Status()> ops);

  Backend* const backend_;
  const bool active_;
  const std::string what_;
  std::map<CaptureKey, Entry> entries_;
  size_t replays_ = 0;
  size_t captures_ = 0;
  size_t failed_captures_ = 0;
  bool failure_logged_ = false;
};

}  // namespace cohort::compute
