#pragma once
// What one Watch stream has queued for a client that may read slowly or
// not at all. Progress events coalesce (each carries the whole job's
// progress, so only the newest matters) and a client that falls further
// behind than the limits is dropped rather than buffered for: what a watcher
// can make the coordinator hold is bounded by kMaxEvents and kMaxBytes.
// Not thread-safe; WatchReactor guards it with its mutex.

#include <cstddef>
#include <deque>

#include "cohort/v1/jobs.pb.h"

namespace cohort::coordinator {

class WatchOutbox {
 public:
  // Beyond the event being written.
  static constexpr size_t kMaxEvents = 64;
  static constexpr size_t kMaxBytes = 8 << 20;

  enum class Added {
    kStartWrite,  // queued, and nothing is being written: write front()
    kQueued,      // queued behind the write in flight
    kCoalesced,   // replaced a progress event that was still waiting
    kOverflow,    // over the limits: nothing was queued; drop the watcher
  };
  Added Add(const v1::JobEvent& event);

  // The event being written (valid while !empty()).
  const v1::JobEvent& front() const { return queue_.front().event; }
  // The front's write completed; true when another is to be written.
  bool PopWritten();
  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Queued {
    v1::JobEvent event;
    size_t bytes;  // its serialized size, counted in bytes_
  };
  std::deque<Queued> queue_;  // front: being written
  size_t bytes_ = 0;
};

}  // namespace cohort::coordinator
