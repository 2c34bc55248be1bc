#include "coordinator/kv_store.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::coordinator {
namespace {

std::string DescribeScope(const KvScope& scope) {
  return absl::StrCat("job ", scope.job.value(), " generation ", scope.generation.value());
}

std::string DescribeKey(const KvScope& scope, const std::string& key) {
  return absl::StrCat("key \"", key, "\" in ", DescribeScope(scope));
}

absl::Status ValidateKey(const KvStore::Options& options, const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (key.size() > options.max_key_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "key is ", key.size(), " bytes, over the limit of ", options.max_key_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

KvStore::KvStore(Options options) : options_(options) {}

absl::Status KvStore::CheckLimits(const KvScope& scope, const std::string& key,
                                  const std::string& value) const {
  if (absl::Status status = ValidateKey(options_, key); !status.ok()) return status;
  if (value.size() > options_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("value of ", DescribeKey(scope, key), " is ", value.size(),
                     " bytes, over the limit of ", options_.max_value_bytes,
                     " bytes (--max_kv_value_bytes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<KvCompletion>> KvStore::Set(const KvScope& scope, const std::string& key,
                                                       std::string value) {
  if (absl::Status status = CheckLimits(scope, key, value); !status.ok()) return status;
  // Check the key limit before creating the scope, so a refused Set leaves
  // nothing behind.
  auto existing = scopes_.find(scope);
  const bool is_new_key = existing == scopes_.end() || !existing->second.values.contains(key);
  const size_t keys_in_scope = existing == scopes_.end() ? 0 : existing->second.values.size();
  if (is_new_key && keys_in_scope >= options_.max_keys_per_scope) {
    return absl::ResourceExhaustedError(
        absl::StrCat(DescribeScope(scope), " already holds ", keys_in_scope,
                     " keys, the limit max_keys_per_scope=", options_.max_keys_per_scope));
  }

  const size_t old_bytes =
      is_new_key ? 0 : key.size() + existing->second.values.find(key)->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (new_bytes > old_bytes) {
    const size_t grow = new_bytes - old_bytes;
    auto held = job_bytes_.find(scope.job);
    const size_t job_bytes = held == job_bytes_.end() ? 0 : held->second;
    if (job_bytes + grow > options_.max_bytes_per_job) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", scope.job.value(), "'s KeyValue holds ", job_bytes, " bytes; ", grow,
          " more would pass its budget of ", options_.max_bytes_per_job, " bytes"));
    }
    if (total_bytes_ + grow > options_.max_total_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the KeyValue store holds ", total_bytes_, " bytes; ", grow,
          " more would pass its budget of ", options_.max_total_bytes, " bytes"));
    }
  }

  Scope& entry = scopes_[scope];
  entry.bytes = entry.bytes + new_bytes - old_bytes;
  size_t& job_bytes = job_bytes_[scope.job];
  job_bytes = job_bytes + new_bytes - old_bytes;
  total_bytes_ = total_bytes_ + new_bytes - old_bytes;
  std::vector<KvCompletion> completions;
  if (auto waiting = entry.waiters.find(key); waiting != entry.waiters.end()) {
    completions.reserve(waiting->second.size());
    for (Waiter& waiter : waiting->second) {
      deadlines_.erase(DeadlineKey{waiter.deadline, waiter.id});
      completions.push_back(KvCompletion{std::move(waiter.callback), value});
    }
    entry.waiters.erase(waiting);
  }
  entry.values.insert_or_assign(key, std::move(value));
  return completions;
}

absl::StatusOr<std::string> KvStore::Get(const KvScope& scope, const std::string& key) const {
  if (absl::Status status = ValidateKey(options_, key); !status.ok()) return status;
  auto entry = scopes_.find(scope);
  if (entry != scopes_.end()) {
    auto value = entry->second.values.find(key);
    if (value != entry->second.values.end()) return value->second;
  }
  return absl::NotFoundError(absl::StrCat(DescribeKey(scope, key), " is not set"));
}

std::vector<KvCompletion> KvStore::WaitFor(const KvScope& scope, const std::string& key,
                                           absl::Time deadline, KvWaiterCallback callback,
                                           uint64_t* id_out) {
  if (id_out != nullptr) *id_out = 0;
  std::vector<KvCompletion> completions;
  if (absl::Status status = ValidateKey(options_, key); !status.ok()) {
    completions.push_back(KvCompletion{std::move(callback), std::move(status)});
    return completions;
  }
  Scope& entry = scopes_[scope];
  if (auto value = entry.values.find(key); value != entry.values.end()) {
    completions.push_back(KvCompletion{std::move(callback), value->second});
    return completions;
  }
  const uint64_t id = next_waiter_id_++;
  entry.waiters[key].push_back(Waiter{id, deadline, std::move(callback)});
  deadlines_.emplace(DeadlineKey{deadline, id}, WaiterLocation{scope, key});
  if (id_out != nullptr) *id_out = id;
  return completions;
}

std::vector<KvCompletion> KvStore::CancelWaiter(const KvScope& scope, const std::string& key,
                                                uint64_t id) {
  std::vector<KvCompletion> completions;
  auto entry = scopes_.find(scope);
  if (entry == scopes_.end()) return completions;
  auto waiting = entry->second.waiters.find(key);
  if (waiting == entry->second.waiters.end()) return completions;
  std::vector<Waiter>& waiters = waiting->second;
  auto waiter =
      std::find_if(waiters.begin(), waiters.end(), [id](const Waiter& w) { return w.id == id; });
  if (waiter == waiters.end()) return completions;
  deadlines_.erase(DeadlineKey{waiter->deadline, waiter->id});
  completions.push_back(KvCompletion{
      std::move(waiter->callback),
      absl::CancelledError(absl::StrCat("the wait for ", DescribeKey(scope, key),
                                        " was cancelled by its caller"))});
  waiters.erase(waiter);
  if (waiters.empty()) entry->second.waiters.erase(waiting);
  EraseScopeIfEmpty(scope);
  return completions;
}

std::vector<KvCompletion> KvStore::Expire(absl::Time now) {
  std::vector<KvCompletion> completions;
  while (!deadlines_.empty() && deadlines_.begin()->first.first <= now) {
    auto node = deadlines_.extract(deadlines_.begin());
    const uint64_t id = node.key().second;
    const WaiterLocation& location = node.mapped();

    auto entry = scopes_.find(location.scope);
    CHECK(entry != scopes_.end()) << "deadline index names a missing scope";
    auto waiting = entry->second.waiters.find(location.key);
    CHECK(waiting != entry->second.waiters.end()) << "deadline index names a missing key";
    std::vector<Waiter>& waiters = waiting->second;
    auto waiter =
        std::find_if(waiters.begin(), waiters.end(), [id](const Waiter& w) { return w.id == id; });
    CHECK(waiter != waiters.end()) << "deadline index names a missing waiter";

    completions.push_back(
        KvCompletion{std::move(waiter->callback),
                     absl::DeadlineExceededError(absl::StrCat(
                         "timed out waiting for ", DescribeKey(location.scope, location.key)))});
    waiters.erase(waiter);
    if (waiters.empty()) entry->second.waiters.erase(waiting);
    EraseScopeIfEmpty(location.scope);
  }
  return completions;
}

std::vector<KvCompletion> KvStore::DropScope(const KvScope& scope, const std::string& reason) {
  std::vector<KvCompletion> completions;
  auto entry = scopes_.find(scope);
  if (entry == scopes_.end()) return completions;

  // Waiter ids grow with registration, so sorting by id gives a stable,
  // registration-ordered result independent of hash map iteration order.
  std::vector<std::pair<uint64_t, KvCompletion>> ordered;
  for (auto& [key, waiters] : entry->second.waiters) {
    for (Waiter& waiter : waiters) {
      deadlines_.erase(DeadlineKey{waiter.deadline, waiter.id});
      ordered.emplace_back(
          waiter.id, KvCompletion{std::move(waiter.callback),
                                  absl::AbortedError(absl::StrCat(reason, " (was waiting for ",
                                                                  DescribeKey(scope, key), ")"))});
    }
  }
  if (entry->second.bytes > 0) {
    total_bytes_ -= entry->second.bytes;
    auto held = job_bytes_.find(scope.job);
    held->second -= entry->second.bytes;
    if (held->second == 0) job_bytes_.erase(held);
  }
  scopes_.erase(entry);

  std::sort(ordered.begin(), ordered.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  completions.reserve(ordered.size());
  for (auto& [id, completion] : ordered) completions.push_back(std::move(completion));
  return completions;
}

std::vector<KvCompletion> KvStore::DropOlderThan(const JobId& job, Generation generation,
                                                 const std::string& reason) {
  const bool drop_all = generation.value() == std::numeric_limits<uint64_t>::max();
  std::vector<KvScope> doomed;
  for (const auto& [scope, entry] : scopes_) {
    if (scope.job == job && (drop_all || scope.generation < generation)) doomed.push_back(scope);
  }
  // Oldest generation first, for a deterministic completion order.
  std::sort(doomed.begin(), doomed.end(),
            [](const KvScope& a, const KvScope& b) { return a.generation < b.generation; });
  std::vector<KvCompletion> completions;
  for (const KvScope& scope : doomed) {
    std::vector<KvCompletion> dropped = DropScope(scope, reason);
    std::move(dropped.begin(), dropped.end(), std::back_inserter(completions));
  }
  return completions;
}

size_t KvStore::key_count() const {
  size_t count = 0;
  for (const auto& [scope, entry] : scopes_) count += entry.values.size();
  return count;
}

size_t KvStore::waiter_count() const { return deadlines_.size(); }

void KvStore::EraseScopeIfEmpty(const KvScope& scope) {
  auto entry = scopes_.find(scope);
  if (entry != scopes_.end() && entry->second.values.empty() && entry->second.waiters.empty()) {
    scopes_.erase(entry);
  }
}

}  // namespace cohort::coordinator
