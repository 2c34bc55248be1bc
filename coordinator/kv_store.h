#pragma once
// KvStore: the KeyValue service's logic. Keys live in a scope (job, generation);
// waiters block until a key appears or their deadline passes. Pure logic: no
// threads, no I/O; the caller runs the returned callbacks (outside its lock).
// Not thread-safe.
//
// Only the job's current generation is writable and readable: the caller (the
// Coordinator) checks the generation against the JobManager before calling.
// DropScope removes a whole (job, generation) and fails its waiters (Aborted),
// which is what happens on every generation change and when a job ends.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/ids.h"
#include "common/message_limits.h"

namespace cohort::coordinator {

struct KvScope {
  JobId job;
  Generation generation;
  template <typename H>
  friend H AbslHashValue(H h, const KvScope& s) {
    return H::combine(std::move(h), s.job, s.generation);
  }
  bool operator==(const KvScope&) const = default;
};

// Called exactly once with the value, DeadlineExceeded or Aborted.
using KvWaiterCallback = std::function<void(absl::StatusOr<std::string>)>;

// A callback ready to be run by the caller, with its result.
struct KvCompletion {
  KvWaiterCallback callback;
  absl::StatusOr<std::string> result;
  void Run() { callback(std::move(result)); }
};

class KvStore {
 public:
  struct Options {
    size_t max_value_bytes = kDefaultMaxKvValueBytes;  // per value
    size_t max_keys_per_scope = 1 << 16;
    size_t max_key_bytes = 1024;
    // Keys plus values held for one job (all its scopes), and in all: what
    // a worker certificate can make the coordinator hold. A job's own
    // bootstrap needs a few hundred bytes per participant.
    size_t max_bytes_per_job = 64 << 20;
    size_t max_total_bytes = size_t{1} << 30;
  };
  explicit KvStore(Options options);

  // Stores the value (overwriting) and returns the waiters it completes.
  // InvalidArgument for an empty key; ResourceExhausted for a too long key,
  // a too large value, when the scope holds max_keys_per_scope keys, or
  // when the job's or the store's bytes would pass their budget.
  absl::StatusOr<std::vector<KvCompletion>> Set(const KvScope& scope, const std::string& key,
                                                std::string value);
  // Set's key and value checks alone (not the keys-per-scope limit).
  absl::Status CheckLimits(const KvScope& scope, const std::string& key,
                           const std::string& value) const;
  // NotFound if absent; InvalidArgument for an empty key, ResourceExhausted
  // for a too long one.
  absl::StatusOr<std::string> Get(const KvScope& scope, const std::string& key) const;
  // If the key exists, returns a completion with its value at once; otherwise
  // registers the waiter until `deadline` and returns nothing. An empty or
  // too long key completes at once with its ValidateKey error.
  // `*id` (if given) is the registered waiter's id, or 0 when it completed
  // at once.
  std::vector<KvCompletion> WaitFor(const KvScope& scope, const std::string& key,
                                    absl::Time deadline, KvWaiterCallback callback,
                                    uint64_t* id = nullptr);
  // Removes waiter `id` of (scope, key), completing it with Cancelled; none
  // if it is no longer waiting.
  std::vector<KvCompletion> CancelWaiter(const KvScope& scope, const std::string& key,
                                         uint64_t id);
  // Completes waiters whose deadline <= now with DeadlineExceeded (message
  // names the key and scope), earliest deadline first. Cost is proportional to
  // the number expired; allocates nothing when none is due.
  std::vector<KvCompletion> Expire(absl::Time now);
  // Removes every key and waiter of the scope; waiters get Aborted whose
  // message starts with `reason` (then names the key), in registration order.
  std::vector<KvCompletion> DropScope(const KvScope& scope, const std::string& reason);
  // Drops every scope of `job` with generation < `generation` (all if
  // generation is max): call on each generation change.
  std::vector<KvCompletion> DropOlderThan(const JobId& job, Generation generation,
                                          const std::string& reason);

  size_t key_count() const;
  size_t total_bytes() const { return total_bytes_; }
  size_t waiter_count() const;

 private:
  struct Waiter {
    uint64_t id;
    absl::Time deadline;
    KvWaiterCallback callback;
  };
  struct Scope {
    absl::flat_hash_map<std::string, std::string> values;
    // Per key, in registration order (completed in that order).
    absl::flat_hash_map<std::string, std::vector<Waiter>> waiters;
    size_t bytes = 0;  // keys plus values
  };
  // Where a waiter lives, so Expire finds it without scanning every scope.
  struct WaiterLocation {
    KvScope scope;
    std::string key;
  };
  using DeadlineKey = std::pair<absl::Time, uint64_t>;  // (deadline, waiter id)

  // Erases the scope if it holds neither values nor waiters, so scopes that
  // only ever had waiters do not accumulate.
  void EraseScopeIfEmpty(const KvScope& scope);

  Options options_;
  uint64_t next_waiter_id_ = 1;
  absl::flat_hash_map<KvScope, Scope> scopes_;
  absl::flat_hash_map<JobId, size_t> job_bytes_;  // jobs holding any
  size_t total_bytes_ = 0;
  // Every registered waiter, ordered by deadline: Expire walks only the
  // expired prefix, so it costs nothing when nothing is due.
  std::map<DeadlineKey, WaiterLocation> deadlines_;
};

}  // namespace cohort::coordinator
