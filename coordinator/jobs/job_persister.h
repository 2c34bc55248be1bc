#pragma once
// JobPersister: job records written off the coordinator's lock, with group
// commit.
//
// The facade changes jobs under its mutex, which every heartbeat needs; a
// synced RocksDB write there would make every heartbeat wait for the disk.
// So JobManager writes through this JobStore, whose Put and Delete only
// queue the record (the newest one per job replaces an older queued one)
// and return a ticket, and the facade, once it has released its mutex,
// calls Flush(ticket) before it answers the call or sends the messages the
// change caused: nothing a worker or client learns is ahead of the disk.
// Flush is group commit: the first caller writes everything queued so far in
// one synced batch while later callers wait for it, so many changes share
// one disk sync.
//
// A failed batch is queued again (unless a newer record of the same job was
// queued meanwhile) and written by the next Flush; Flush returns the error
// so the caller can say so. NextJobNumber and LoadAll go straight to the
// durable store: call them without the facade's mutex.
//
// Thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/jobs/job_store.h"

namespace cohort::coordinator {

class JobPersister : public JobStore {
 public:
  // `durable` must outlive the persister. `on_batch` (optional) is told of
  // each batch written: its records and how long the write took.
  using BatchObserver = std::function<void(int64_t records, absl::Duration took)>;
  explicit JobPersister(JobStore* durable, BatchObserver on_batch = nullptr)
      : durable_(durable), on_batch_(std::move(on_batch)) {}

  // Queue; always OK (InvalidArgument for an empty job id).
  absl::Status Put(const v1::Job& job) override;
  absl::Status Delete(const std::string& job_id) override;
  absl::Status Write(const std::vector<JobWrite>& writes) override;
  // Pass-through (disk I/O).
  absl::StatusOr<std::vector<v1::Job>> LoadAll() override;
  absl::StatusOr<int64_t> NextJobNumber() override;

  // The ticket of the newest queued write (0: none yet).
  uint64_t last_ticket() const;
  // Whether any write waits to be written (e.g. left by a failed batch).
  bool has_queued() const;
  // Makes every write with a ticket <= `ticket` durable, writing what is
  // queued or waiting for the batch in flight. OK once they are; the store's
  // error if this call's batch failed (its writes stay queued).
  absl::Status Flush(uint64_t ticket);

  struct Counters {
    uint64_t batches = 0;  // synced batches written
    uint64_t records = 0;  // records in them (after coalescing)
    uint64_t failures = 0;
  };
  Counters counters() const;

 private:
  struct Queued {
    JobWrite write;
    uint64_t ticket = 0;
  };
  uint64_t QueueLocked(JobWrite write) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobStore* const durable_;
  const BatchObserver on_batch_;
  mutable absl::Mutex mu_;
  std::map<std::string, Queued> queued_ ABSL_GUARDED_BY(mu_);  // by job id
  uint64_t last_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_ticket_ ABSL_GUARDED_BY(mu_) = 0;  // every write <= it is on disk
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  absl::Time last_failure_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t failures_logged_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cohort::coordinator
