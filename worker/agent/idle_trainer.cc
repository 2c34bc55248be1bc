#include "worker/agent/idle_trainer.h"

namespace cohort::worker {

absl::Status IdleTrainer::Prepare(const Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  current_ = assignment;
  return absl::OkStatus();
}

absl::Status IdleTrainer::Donate(const Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  current_.reset();
  return absl::OkStatus();
}

void IdleTrainer::Stop() {
  absl::MutexLock lock(&mu_);
  current_.reset();
}

std::optional<Assignment> IdleTrainer::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

}  // namespace cohort::worker
