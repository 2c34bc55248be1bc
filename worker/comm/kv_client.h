#pragma once
// KvClient: the bootstrap channel communicators use to exchange addresses
// (UCX worker addresses, ncclUniqueId) with their peers. The real one talks
// to the coordinator's KeyValue service within one (job, generation) scope:
// a new generation sees none of the old keys, so it builds new communicators.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls_credentials.h"

namespace cohort::comm {

// Thread-safe.
class KvClient {
 public:
  virtual ~KvClient() = default;
  // Stores `value` under `key` (overwriting). Errors: Unavailable (retry),
  // Aborted (the scope's generation is over), InvalidArgument.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting up to `timeout` for it to be set.
  // DeadlineExceeded if it never is; Aborted if the generation ends first.
  virtual absl::StatusOr<std::string> WaitFor(const std::string& key,
                                              absl::Duration timeout) = 0;
};

struct KvScopeRef {
  std::string job_id;
  uint64_t generation = 0;
};

// A KvClient over the coordinator's cohort.v1.KeyValue service at `target`
// (host:port), for one scope. Retries Unavailable with backoff within the
// caller's timeout.
std::unique_ptr<KvClient> NewCoordinatorKvClient(const CoordinatorTarget& target,
                                                 KvScopeRef scope);

}  // namespace cohort::comm
