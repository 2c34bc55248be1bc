#pragma once
// The guarded backend's captures (guarded_backend.h; backend.h, "Captured op
// sequences"), kept apart so that the backend's header stays about memory.
// While a capture is open each op is recorded as a closure over its
// arguments instead of run; a replay runs the closures in order, so it reads
// the memory's contents at replay time, as a CUDA graph does. A call that a
// CUDA capture forbids, made while capturing, does not run and fails the
// capture: EndCapture returns FailedPrecondition naming it, as a GPU's
// capture fails, and the caller's fallback can be tested (a CHECK would end
// the test instead of exercising it).
//
// Captures go stale as a GPU backend's do: the owner bumps the generation
// when memory it keeps for itself moves (AttachParams, ReserveScratch), and
// a capture of an older generation is refused.
//
// Header-only; thread-compatible.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/compute/backend.h"

namespace cohort::testing {

class GuardedCapture final : public compute::CapturedOps {
 public:
  GuardedCapture(const void* owner, uint64_t generation, std::vector<std::function<void()>> ops)
      : owner_(owner), generation_(generation), ops_(std::move(ops)) {}
  const void* owner() const { return owner_; }
  uint64_t generation() const { return generation_; }
  size_t size() const { return ops_.size(); }
  void Run() const {
    for (const std::function<void()>& op : ops_) op();
  }

 private:
  const void* owner_;
  uint64_t generation_;
  std::vector<std::function<void()>> ops_;
};

class CaptureRecorder {
 public:
  bool capturing() const { return capturing_; }
  // Memory the owner keeps for itself moved: older captures are stale.
  void BumpGeneration() { ++generation_; }
  // An op to make uncapturable (as a library call a GPU cannot record):
  // issued while capturing, it fails the capture like a forbidden call.
  void set_uncapturable_op(std::string op) { uncapturable_op_ = std::move(op); }

  absl::Status Begin() {
    if (capturing_) return absl::FailedPreconditionError("BeginCapture: a capture is open");
    capturing_ = true;
    failure_ = absl::OkStatus();
    ops_.clear();
    return absl::OkStatus();
  }
  // Runs `op` now, or records it while capturing (or fails the capture
  // when `name` is the uncapturable op).
  void RunOrRecord(const char* name, std::function<void()> op) {
    if (!capturing_) {
      op();
      return;
    }
    if (name == uncapturable_op_) {
      Forbid(name);
      return;
    }
    ops_.push_back(std::move(op));
  }
  // A call a capture forbids: true (the caller must not run it) and the
  // capture failed while capturing; false otherwise.
  bool Forbid(const char* call) {
    if (!capturing_) return false;
    if (failure_.ok()) {
      failure_ = absl::FailedPreconditionError(
          absl::StrCat(call, " during a capture (a CUDA graph cannot record it)"));
    }
    return true;
  }
  absl::StatusOr<std::unique_ptr<compute::CapturedOps>> End(const void* owner) {
    if (!capturing_) return absl::FailedPreconditionError("EndCapture without an open capture");
    capturing_ = false;
    std::vector<std::function<void()>> ops = std::move(ops_);
    ops_.clear();
    if (!failure_.ok()) return std::exchange(failure_, absl::OkStatus());
    ++captures_;
    return std::make_unique<GuardedCapture>(owner, generation_, std::move(ops));
  }
  // Runs `ops` (CHECKed to be `owner`'s); FailedPrecondition when stale.
  absl::Status Replay(const void* owner, const compute::CapturedOps& ops) {
    const auto* capture = dynamic_cast<const GuardedCapture*>(&ops);
    CHECK(capture != nullptr && capture->owner() == owner) << "Replay of another backend's capture";
    if (Forbid("Replay")) return absl::FailedPreconditionError("Replay during a capture");
    if (capture->generation() != generation_) {
      return absl::FailedPreconditionError("a stale capture: the backend's memory moved since");
    }
    ++replays_;
    capture->Run();
    return absl::OkStatus();
  }
  // Since creation: captures made, replays run.
  size_t captures() const { return captures_; }
  size_t replays() const { return replays_; }

 private:
  bool capturing_ = false;
  absl::Status failure_;
  std::vector<std::function<void()>> ops_;
  uint64_t generation_ = 0;
  std::string uncapturable_op_;
  size_t captures_ = 0;
  size_t replays_ = 0;
};

}  // namespace cohort::testing
