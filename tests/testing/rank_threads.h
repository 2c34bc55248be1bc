#pragma once
// Runs one body per rank, each on its own thread, and collects what each
// returned: for unit tests whose ranks talk through in-process transports
// (worker/comm/in_memory_channel.h, thread_comms.h).

#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace cohort::testing {

// Calls body(r) for r in [0, n) on n threads and returns once all have
// returned, with each rank's status in rank order. `body` must not throw.
inline std::vector<absl::Status> RunOnRankThreads(int n,
                                                  const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> statuses(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { statuses[static_cast<size_t>(r)] = body(r); });
  }
  for (std::thread& thread : threads) thread.join();
  return statuses;
}

}  // namespace cohort::testing
