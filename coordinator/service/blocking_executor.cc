#include "coordinator/service/blocking_executor.h"

namespace cohort::coordinator {

BlockingExecutor::BlockingExecutor(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

BlockingExecutor::~BlockingExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void BlockingExecutor::Schedule(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
}

bool BlockingExecutor::HasWorkOrStopping() const { return stopping_ || !queue_.empty(); }

void BlockingExecutor::Loop() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &BlockingExecutor::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping, nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace cohort::coordinator
