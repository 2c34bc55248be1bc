#pragma once
// JobStore: durable job records. The real implementation is RocksDbJobStore
// (coordinator/store/rocksdb_job_store.h); tests use InMemoryJobStore.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cohort/v1/job.pb.h"

namespace cohort::coordinator {

// One record to write: the job (put) or, without one, its deletion.
struct JobWrite {
  std::string job_id;
  std::optional<v1::Job> job;
};

// Implementations are thread-safe.
class JobStore {
 public:
  virtual ~JobStore() = default;
  // Durably writes the job (keyed by job_id), replacing any earlier record.
  // The write is synced: it survives kill -9 of the process and a power loss.
  // InvalidArgument if job_id is empty.
  virtual absl::Status Put(const v1::Job& job) = 0;
  // Every stored job, in job_id order. DataLoss if a record cannot be parsed.
  virtual absl::StatusOr<std::vector<v1::Job>> LoadAll() = 0;
  // Durably stores and returns the next job number (1, 2, ...), used to make
  // job ids unique across coordinator restarts.
  virtual absl::StatusOr<int64_t> NextJobNumber() = 0;
  // Durably removes the job's record (synced, like Put); OK if absent.
  virtual absl::Status Delete(const std::string& job_id) = 0;
  // Applies `writes` in order, durably; the default applies them one by one
  // (stopping at the first error), a real store as one synced batch that
  // lands whole or not at all (one disk sync for many writes).
  virtual absl::Status Write(const std::vector<JobWrite>& writes);
};

class InMemoryJobStore : public JobStore {
 public:
  absl::Status Put(const v1::Job& job) override;
  absl::StatusOr<std::vector<v1::Job>> LoadAll() override;
  absl::StatusOr<int64_t> NextJobNumber() override;
  absl::Status Delete(const std::string& job_id) override;
  // All or nothing, like a real store's batch.
  absl::Status Write(const std::vector<JobWrite>& writes) override;
  // Test hook: the next Put (or Write) fails with `status`.
  void FailNextPut(absl::Status status);

 private:
  absl::Mutex mu_;
  std::map<std::string, v1::Job> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status next_put_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::coordinator
