#include "coordinator/store/rocksdb_status.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "rocksdb/db.h"
#include "rocksdb/status.h"

namespace cohort::coordinator {
namespace {

// Whether an IOError is RocksDB failing to take the LOCK file, which means
// another process (or another DB object in this one) has the directory open.
// Matched on RocksDB's two lock-contention phrasings ("While lock file" from
// fcntl, "lock hold by current process" for a second open in this process)
// rather than a bare "lock", which would also match messages about blocks and
// "while open a file for lock" (a permission problem, not contention).
bool IsLockError(const rocksdb::Status& status) {
  if (!status.IsIOError()) return false;
  const std::string text = status.ToString();
  return absl::StrContains(text, "While lock file") ||
         absl::StrContains(text, "lock hold by current process");
}

}  // namespace

absl::Status FromRocksDb(const rocksdb::Status& status, const std::string& dir,
                         const std::string& action) {
  if (status.ok()) return absl::OkStatus();
  if (IsLockError(status)) {
    return absl::UnavailableError(absl::StrCat(
        "data dir ", dir,
        " is locked: another coordinator may be using it (RocksDB: ", status.ToString(), ")"));
  }
  const std::string message =
      absl::StrCat("RocksDB ", action, " in data dir ", dir, " failed: ", status.ToString());
  if (status.IsCorruption()) return absl::DataLossError(message);
  return absl::InternalError(message);
}

void CloseRocksDb(std::unique_ptr<rocksdb::DB>& db,
                  std::vector<rocksdb::ColumnFamilyHandle*>& handles, const std::string& dir) {
  if (db == nullptr) return;
  for (rocksdb::ColumnFamilyHandle* handle : handles) {
    rocksdb::Status status = db->DestroyColumnFamilyHandle(handle);
    if (!status.ok()) LOG(WARNING) << "closing a column family in " << dir << ": " << status.ToString();
  }
  handles.clear();
  rocksdb::Status status = db->Close();
  if (!status.ok()) LOG(WARNING) << "closing " << dir << ": " << status.ToString();
  db.reset();
}

}  // namespace cohort::coordinator
