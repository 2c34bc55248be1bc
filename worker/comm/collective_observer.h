#pragma once
// The kinds of communicator calls and the observer told about each one
// (TrackedCommunicator reports to it; the worker's communication metrics
// implement it).

#include <cstddef>

#include "absl/time/time.h"

namespace cohort::comm {

enum class Collective {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kSendRecv,
  kBarrier,
};
inline constexpr int kCollectiveKinds = 8;

// "allreduce", "reduce_scatter", ... (metric label values).
inline const char* CollectiveName(Collective c) {
  constexpr const char* kNames[kCollectiveKinds] = {"allreduce", "reduce_scatter", "allgather",
                                                    "broadcast", "send",           "recv",
                                                    "sendrecv",  "barrier"};
  return kNames[static_cast<int>(c)];
}

// Told about every call, successful or not, from the calling thread.
class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  // `bytes`: the call's full buffer (AllReduce and Broadcast: count; the
  // reduce-scatter input and the allgather output: count_per_rank x size;
  // point to point: the bytes sent plus received).
  virtual void Observe(Collective collective, size_t bytes, absl::Duration elapsed) = 0;
  // The call watchdog (call_watchdog.h) aborted a call of this kind that had
  // run past its timeout plus the grace; from the watchdog's thread.
  virtual void WatchdogAborted(Collective collective) {}
};

}  // namespace cohort::comm
