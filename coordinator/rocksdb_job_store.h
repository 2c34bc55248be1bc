#pragma once
// RocksDbJobStore: JobStore in the coordinator's RocksDB data directory.
// Key schema (docs/architecture.md, "Coordinator state"):
//   column family "jobs":  "job/<job_id>"  -> serialized cohort.v1.Job
//                          "meta/next_job_number" -> decimal int64
// Every write uses WriteOptions::sync = true.

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

#include "absl/status/statusor.h"
#include "coordinator/job_store.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace cohort::coordinator {

class RocksDbJobStore : public JobStore {
 public:
  // Opens (creating if missing) the database in `data_dir`. Unavailable if
  // the directory is locked by another coordinator; Internal/DataLoss for
  // other RocksDB errors (converted from rocksdb::Status here, once).
  static absl::StatusOr<std::unique_ptr<RocksDbJobStore>> Open(const std::string& data_dir);
  ~RocksDbJobStore() override;

  absl::Status Put(const v1::Job& job) override;
  absl::StatusOr<std::vector<v1::Job>> LoadAll() override;
  absl::StatusOr<int64_t> NextJobNumber() override;

  // For later issues (checkpoint store) that share the same database.
  rocksdb::DB* db() const { return db_.get(); }

 private:
  RocksDbJobStore() = default;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // [default, jobs]
  absl::Mutex counter_mu_;  // serialises NextJobNumber's read-modify-write
};

}  // namespace cohort::coordinator
