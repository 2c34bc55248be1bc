#pragma once
// BlockingExecutor: a fixed pool of threads for work that blocks on disk
// (checkpoint store reads, writes, flushes and compactions), so that gRPC's
// callback threads, which also carry heartbeats and Attach streams, never
// wait on storage.
//
// Thread-safe. The destructor runs what is queued, then joins.

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace cohort::coordinator {

class BlockingExecutor {
 public:
  explicit BlockingExecutor(int threads);
  ~BlockingExecutor();
  BlockingExecutor(const BlockingExecutor&) = delete;
  BlockingExecutor& operator=(const BlockingExecutor&) = delete;

  void Schedule(std::function<void()> work);

 private:
  void Loop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace cohort::coordinator
