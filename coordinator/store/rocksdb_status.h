#pragma once
// The one place rocksdb::Status becomes absl::Status (docs/conventions.md, Errors), shared
// by the job store and the checkpoint store.

#include <string>

#include "absl/status/status.h"

#include <memory>
#include <vector>

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Status;
}  // namespace rocksdb

namespace cohort::coordinator {

// OK for OK. Unavailable when another process (or another DB object in this
// one) holds the directory's LOCK; DataLoss for corruption; Internal
// otherwise. Messages name `dir` and `action` ("open", "write of job/x").
absl::Status FromRocksDb(const rocksdb::Status& status, const std::string& dir,
                         const std::string& action);

// Releases `handles` and closes `db` (if open), logging what fails: Close
// reports errors that the DB destructor would swallow.
void CloseRocksDb(std::unique_ptr<rocksdb::DB>& db,
                  std::vector<rocksdb::ColumnFamilyHandle*>& handles, const std::string& dir);

}  // namespace cohort::coordinator
