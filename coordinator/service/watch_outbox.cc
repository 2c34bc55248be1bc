#include "coordinator/service/watch_outbox.h"

namespace cohort::coordinator {

WatchOutbox::Added WatchOutbox::Add(const v1::JobEvent& event) {
  const size_t event_bytes = event.ByteSizeLong();
  // Only a waiting event (not the front, which may be in a write) can be
  // replaced.
  if (event.kind() == v1::JOB_EVENT_KIND_PROGRESS && queue_.size() >= 2 &&
      queue_.back().event.kind() == v1::JOB_EVENT_KIND_PROGRESS) {
    bytes_ = bytes_ - queue_.back().bytes + event_bytes;
    queue_.back() = Queued{event, event_bytes};
    return Added::kCoalesced;
  }
  // The front is in flight; the limits count what waits behind it. One
  // waiting event is always allowed, however large, so a big snapshot is
  // never refused on its own.
  const size_t waiting = queue_.empty() ? 0 : queue_.size() - 1;
  const size_t waiting_bytes = queue_.empty() ? 0 : bytes_ - queue_.front().bytes;
  if (waiting >= kMaxEvents || (waiting > 0 && waiting_bytes + event_bytes > kMaxBytes)) {
    return Added::kOverflow;
  }
  const bool idle = queue_.empty();
  bytes_ += event_bytes;
  queue_.push_back(Queued{event, event_bytes});
  return idle ? Added::kStartWrite : Added::kQueued;
}

bool WatchOutbox::PopWritten() {
  bytes_ -= queue_.front().bytes;
  queue_.pop_front();
  return !queue_.empty();
}

}  // namespace cohort::coordinator
