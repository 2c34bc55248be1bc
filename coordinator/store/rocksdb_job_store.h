#pragma once
// RocksDbJobStore: JobStore in the coordinator's RocksDB data directory.
// Key schema (docs/architecture.md, "Persistence (RocksDB)"):
//   column family "jobs":  "job/<job_id>"  -> serialized cohort.v1.Job
//                          "meta/next_job_number" -> decimal int64
// Every write uses WriteOptions::sync = true.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

#include "absl/status/statusor.h"
#include "coordinator/jobs/job_store.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace cohort::coordinator {

class RocksDbJobStore : public JobStore {
 public:
  // Opens (creating the directory and database if missing) the database in
  // `data_dir`, with column families "default" and "jobs" plus any others
  // already on disk (so later users of db() may add their own). Unavailable if
  // the directory is locked by another coordinator (or another store in this
  // process); DataLoss if RocksDB reports corruption; Internal for other
  // errors. Messages name the data dir.
  static absl::StatusOr<std::unique_ptr<RocksDbJobStore>> Open(const std::string& data_dir);
  ~RocksDbJobStore() override;

  absl::Status Put(const v1::Job& job) override;
  absl::StatusOr<std::vector<v1::Job>> LoadAll() override;
  absl::StatusOr<int64_t> NextJobNumber() override;
  absl::Status Delete(const std::string& job_id) override;
  // One synced WriteBatch.
  absl::Status Write(const std::vector<JobWrite>& writes) override;

  // For later issues (checkpoint store) that share the same database. Owned
  // by this store; valid until it is destroyed.
  rocksdb::DB* db() const { return db_.get(); }

 private:
  explicit RocksDbJobStore(std::string data_dir) : data_dir_(std::move(data_dir)) {}
  rocksdb::ColumnFamilyHandle* jobs_family() const { return handles_[1]; }

  const std::string data_dir_;  // for error messages
  std::unique_ptr<rocksdb::DB> db_;
  // [default, jobs, other families found on disk]; destroyed before db_ closes.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  absl::Mutex counter_mu_;  // serialises NextJobNumber's read-modify-write
};

}  // namespace cohort::coordinator
