#pragma once
// CallWatchdog: a bound on every watched communicator call that does not rely
// on the communicator keeping its own `timeout`. An NCCL kernel waiting on a
// dead peer never returns by itself; a transport bug or a wedged progress
// thread can do the same. A survivor stuck that way never reports the
// failure, never suspends, and holds its device until the coordinator's hang
// detector fences it. The watchdog gives every such call a second deadline,
// its timeout plus a grace, and when that passes it
//   - aborts the call's communicator (Communicator::Abort: the contract every
//     communicator keeps, NCCL's through ncclCommAbort), with a reason that
//     names the group, the call and the deadline, and
//   - trips the call's AbortDomain: every communicator of the generation is
//     aborted with the same reason, as a Suspend aborts them, so calls on the
//     other groups (and the peers' waits on this rank) end too.
// The caller then gets DeadlineExceeded with that reason (TrackedCommunicator
// turns the Aborted of any call of a tripped domain into it), which the
// training loop treats as a lost peer: the worker reports the state it holds
// and keeps its session for the next generation.
//
// Time is the given Clock's (tests use a FakeClock); a monitor thread checks
// the watched calls every poll_interval of real time, and Poll() checks at
// once.
//
// Thread-safe. Watches must end before the watchdog is destroyed; a Watch's
// communicator and domain must outlive it.

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/comm/collective_observer.h"
#include "worker/comm/communicator.h"

namespace cohort::comm {

// The communicators that are aborted together when one of their calls is
// (a generation's). Thread-safe.
class AbortDomain {
 public:
  // `abort_all` aborts every communicator of the domain; called at most once.
  explicit AbortDomain(std::function<void(const absl::Status&)> abort_all)
      : abort_all_(std::move(abort_all)) {}

  // Records `reason` (the first one) and aborts the domain's communicators.
  void Trip(const absl::Status& reason);
  // The first Trip's reason; OK while none.
  absl::Status tripped() const;

 private:
  const std::function<void(const absl::Status&)> abort_all_;
  mutable absl::Mutex mu_;
  absl::Status tripped_ ABSL_GUARDED_BY(mu_);
};

struct CallWatchdogOptions {
  // How long a call may run past its own timeout before it is aborted.
  absl::Duration grace = absl::Seconds(10);
  // Real time between the monitor thread's checks; InfiniteDuration: no
  // thread, only Poll() checks.
  absl::Duration poll_interval = absl::Milliseconds(100);
  // Deadlines are measured on this clock. Not owned; must outlive the watchdog.
  const Clock* clock = RealClock::Get();
};

class CallWatchdog {
 public:
  explicit CallWatchdog(CallWatchdogOptions options);
  ~CallWatchdog();
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  // One call, watched while this lives (from before the call until it
  // returned).
  class Watch {
   public:
    // `group` names the communicator in the reason ("data", "tensor", ...);
    // `domain` and `observer` may be null.
    Watch(CallWatchdog* watchdog, std::string group, Collective collective, absl::Duration timeout,
          Communicator* communicator, AbortDomain* domain, CollectiveObserver* observer);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // The reason the watchdog aborted this call; OK if it did not.
    absl::Status aborted() const;

   private:
    friend class CallWatchdog;
    CallWatchdog* const watchdog_;
    const std::string group_;
    const Collective collective_;
    const absl::Duration timeout_;
    const absl::Time deadline_;  // start + timeout + grace
    Communicator* const communicator_;
    AbortDomain* const domain_;
    CollectiveObserver* const observer_;
    absl::Status aborted_ ABSL_GUARDED_BY(watchdog_->mu_);
  };

  // Aborts every watched call whose deadline has passed on the clock (once
  // each); how many it aborted.
  int Poll();

  absl::Duration grace() const { return options_.grace; }
  // Watched calls aborted since the watchdog was made.
  int aborts() const;

 private:
  void Monitor();

  const CallWatchdogOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<Watch*> watches_ ABSL_GUARDED_BY(mu_);
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace cohort::comm
