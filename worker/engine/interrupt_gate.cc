#include "worker/engine/interrupt_gate.h"

#include <algorithm>

namespace cohort::worker {

void InterruptGate::Begin(const Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  in_flight_ = std::pair(assignment.job_id, assignment.generation);
  for (auto it = interrupted_.begin(); it != interrupted_.end();) {
    if (it->first == assignment.job_id) {
      ++it;
    } else {
      interrupted_.erase(it++);
    }
  }
  auto it = interrupted_.find(assignment.job_id);
  cancelled_ = it != interrupted_.end() && assignment.generation <= it->second;
}

void InterruptGate::End() {
  absl::MutexLock lock(&mu_);
  in_flight_.reset();
}

void InterruptGate::Interrupt(const JobId& job, Generation generation) {
  {
    absl::MutexLock lock(&mu_);
    Generation& newest = interrupted_[job];
    newest = std::max(newest, generation);
    if (!in_flight_.has_value() || in_flight_->first != job || in_flight_->second > generation) {
      return;  // recorded for a Prepare or Donate that has not begun
    }
  }
  InterruptAll();  // it is the one in flight
}

void InterruptGate::InterruptAll() {
  cancelled_ = true;
  absl::MutexLock lock(&building_mu_);
  if (building_ != nullptr) building_->Abort(absl::CancelledError("trainer interrupted"));
}

void InterruptGate::SetBuilding(GenerationRun* run) {
  absl::MutexLock lock(&building_mu_);
  building_ = run;
}

}  // namespace cohort::worker
