#pragma once
// The time span whose heartbeats count, shared by every simulated worker.
// Thread-safe (atomics): the simulator opens and closes it while reactor
// threads ask whether a heartbeat's send time falls inside.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>

namespace cohort::sim {

// Nanoseconds of the monotonic clock; round trips are measured on it so a
// wall-clock step cannot produce negative or huge latencies.
inline int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class MeasurementWindow {
 public:
  void Open(int64_t now_ns) { start_ns_.store(now_ns); }
  void Close(int64_t now_ns) { end_ns_.store(now_ns); }

  // Whether something sent at `sent_ns` belongs to the window: after Open
  // and before Close (an unclosed window extends forever).
  bool Contains(int64_t sent_ns) const {
    const int64_t start = start_ns_.load(std::memory_order_relaxed);
    const int64_t end = end_ns_.load(std::memory_order_relaxed);
    return start != kUnset && sent_ns >= start && (end == kUnset || sent_ns < end);
  }

 private:
  static constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();
  std::atomic<int64_t> start_ns_{kUnset};
  std::atomic<int64_t> end_ns_{kUnset};
};

}  // namespace cohort::sim
