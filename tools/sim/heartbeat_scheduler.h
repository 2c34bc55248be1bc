#pragma once
// HeartbeatScheduler: a few threads that call send(i) for every worker
// i in [0, count) once per interval, with the workers' phases spread evenly
// over the interval so the coordinator sees a smooth load rather than bursts.
// Thread t serves workers t, t + threads, ...; worker i's k-th call is due at
// start + k * interval + PhaseOffset(i, count, interval). A thread that falls
// behind sends late calls at once (it never skips).
//
// Thread-safe: Start and Stop from one controlling thread; `send` runs on the
// scheduler's threads, concurrently for different workers.

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace cohort::sim {

// Offset of worker `index` of `count` within one interval: interval * index / count.
absl::Duration PhaseOffset(int index, int count, absl::Duration interval);

class HeartbeatScheduler {
 public:
  struct Options {
    int count = 0;
    absl::Duration interval = absl::Seconds(1);
    int threads = 2;
  };

  HeartbeatScheduler(Options options, std::function<void(int index)> send);
  ~HeartbeatScheduler();  // Stop()
  HeartbeatScheduler(const HeartbeatScheduler&) = delete;
  HeartbeatScheduler& operator=(const HeartbeatScheduler&) = delete;

  // Starts the threads; the first round begins now. Call once.
  void Start();
  // Stops and joins the threads (idempotent).
  void Stop();

 private:
  void Run(int thread_index, absl::Time start);

  const Options options_;
  const std::function<void(int)> send_;
  int thread_count_ = 0;  // set by Start before any thread runs
  absl::Notification stop_;
  std::vector<std::thread> threads_;
};

}  // namespace cohort::sim
