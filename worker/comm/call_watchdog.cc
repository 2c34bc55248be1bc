#include "worker/comm/call_watchdog.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::comm {

void AbortDomain::Trip(const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (!tripped_.ok()) return;
    tripped_ = reason;
  }
  abort_all_(reason);
}

absl::Status AbortDomain::tripped() const {
  absl::MutexLock lock(&mu_);
  return tripped_;
}

CallWatchdog::CallWatchdog(CallWatchdogOptions options) : options_(std::move(options)) {
  if (options_.poll_interval != absl::InfiniteDuration()) {
    monitor_ = std::thread([this] { Monitor(); });
  }
}

CallWatchdog::~CallWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    CHECK(watches_.empty()) << "a call watchdog destroyed while " << watches_.size()
                            << " calls are watched";
    stopping_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

CallWatchdog::Watch::Watch(CallWatchdog* watchdog, std::string group, Collective collective,
                           absl::Duration timeout, Communicator* communicator, AbortDomain* domain,
                           CollectiveObserver* observer)
    : watchdog_(watchdog),
      group_(std::move(group)),
      collective_(collective),
      timeout_(timeout),
      deadline_(watchdog->options_.clock->Now() + timeout + watchdog->options_.grace),
      communicator_(communicator),
      domain_(domain),
      observer_(observer) {
  absl::MutexLock lock(&watchdog_->mu_);
  watchdog_->watches_.insert(this);
}

CallWatchdog::Watch::~Watch() {
  // Waits for an abort of this call in progress (Poll holds mu_ while it
  // aborts), so the communicator and domain are not used after the call.
  absl::MutexLock lock(&watchdog_->mu_);
  watchdog_->watches_.erase(this);
}

absl::Status CallWatchdog::Watch::aborted() const {
  absl::MutexLock lock(&watchdog_->mu_);
  return aborted_;
}

int CallWatchdog::Poll() {
  const absl::Time now = options_.clock->Now();
  absl::MutexLock lock(&mu_);
  int aborted = 0;
  for (Watch* watch : watches_) {
    if (!watch->aborted_.ok() || now < watch->deadline_) continue;
    const absl::Status reason = absl::DeadlineExceededError(absl::StrCat(
        "watchdog: the ", watch->group_, " group's ", CollectiveName(watch->collective_),
        " was still blocked past its deadline (its timeout ", absl::FormatDuration(watch->timeout_),
        " plus a grace of ", absl::FormatDuration(options_.grace), ", due at ",
        absl::FormatTime(absl::RFC3339_sec, watch->deadline_, absl::UTCTimeZone()),
        "); every communicator of the generation is aborted"));
    watch->aborted_ = reason;
    LOG(WARNING) << reason.message();
    // Abort promises to return promptly without waiting for the call, so
    // holding mu_ (which keeps the watch, its communicator and its domain
    // alive) cannot deadlock with the call's thread.
    watch->communicator_->Abort(reason);
    if (watch->domain_ != nullptr) watch->domain_->Trip(reason);
    if (watch->observer_ != nullptr) watch->observer_->WatchdogAborted(watch->collective_);
    ++aborted;
  }
  aborts_ += aborted;
  return aborted;
}

int CallWatchdog::aborts() const {
  absl::MutexLock lock(&mu_);
  return aborts_;
}

void CallWatchdog::Monitor() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.poll_interval)) return;
    }
    Poll();
  }
}

}  // namespace cohort::comm
