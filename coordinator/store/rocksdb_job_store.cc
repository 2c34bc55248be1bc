#include "coordinator/store/rocksdb_job_store.h"

#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/store/rocksdb_status.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace cohort::coordinator {
namespace {

constexpr char kJobsFamily[] = "jobs";
constexpr char kJobKeyPrefix[] = "job/";
constexpr char kNextJobNumberKey[] = "meta/next_job_number";

rocksdb::WriteOptions SyncWrite() {
  rocksdb::WriteOptions options;
  // Each job record and counter bump must survive a crash or power loss the
  // moment Put returns: the coordinator acknowledges clients after it.
  options.sync = true;
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RocksDbJobStore>> RocksDbJobStore::Open(
    const std::string& data_dir) {
  if (data_dir.empty()) return absl::InvalidArgumentError("data dir must not be empty");
  std::error_code error;
  std::filesystem::create_directories(data_dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create data dir ", data_dir, ": ", error.message()));
  }

  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.keep_log_file_num = 10;  // RocksDB's info LOG files; the default keeps 1000

  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {kJobsFamily, rocksdb::ColumnFamilyOptions()},
  };
  // RocksDB refuses to open a database without naming every family it holds;
  // other stores sharing the database may have added some. A fresh directory
  // has none yet, so a failed listing is expected there: Open reports any
  // real problem.
  std::vector<std::string> existing;
  if (rocksdb::DB::ListColumnFamilies(options, data_dir, &existing).ok()) {
    for (const std::string& name : existing) {
      if (name != rocksdb::kDefaultColumnFamilyName && name != kJobsFamily) {
        families.emplace_back(name, rocksdb::ColumnFamilyOptions());
      }
    }
  }

  rocksdb::DB* raw_db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  RETURN_IF_ERROR(FromRocksDb(rocksdb::DB::Open(options, data_dir, families, &handles, &raw_db),
                              data_dir, "open"));
  auto store = absl::WrapUnique(new RocksDbJobStore(data_dir));
  store->db_.reset(raw_db);
  store->handles_ = std::move(handles);
  return store;
}

RocksDbJobStore::~RocksDbJobStore() { CloseRocksDb(db_, handles_, data_dir_); }

absl::Status RocksDbJobStore::Put(const v1::Job& job) {
  if (job.job_id().empty()) return absl::InvalidArgumentError("job has no job_id");
  std::string value;
  if (!job.SerializeToString(&value)) {
    return absl::InternalError(absl::StrCat("cannot serialize job ", job.job_id()));
  }
  const std::string key = absl::StrCat(kJobKeyPrefix, job.job_id());
  return FromRocksDb(db_->Put(SyncWrite(), jobs_family(), key, value), data_dir_,
                     absl::StrCat("write of ", key));
}

absl::Status RocksDbJobStore::Delete(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: must not be empty");
  const std::string key = absl::StrCat(kJobKeyPrefix, job_id);
  return FromRocksDb(db_->Delete(SyncWrite(), jobs_family(), key), data_dir_,
                     absl::StrCat("delete of ", key));
}

absl::Status RocksDbJobStore::Write(const std::vector<JobWrite>& writes) {
  rocksdb::WriteBatch batch;
  for (const JobWrite& write : writes) {
    if (write.job_id.empty()) return absl::InvalidArgumentError("a write has no job_id");
    const std::string key = absl::StrCat(kJobKeyPrefix, write.job_id);
    rocksdb::Status added;
    if (write.job.has_value()) {
      std::string value;
      if (!write.job->SerializeToString(&value)) {
        return absl::InternalError(absl::StrCat("cannot serialize job ", write.job_id));
      }
      added = batch.Put(jobs_family(), key, value);
    } else {
      added = batch.Delete(jobs_family(), key);
    }
    RETURN_IF_ERROR(FromRocksDb(added, data_dir_, absl::StrCat("batch entry for ", key)));
  }
  return FromRocksDb(db_->Write(SyncWrite(), &batch), data_dir_,
                     absl::StrCat("write of ", writes.size(), " job records"));
}

absl::StatusOr<std::vector<v1::Job>> RocksDbJobStore::LoadAll() {
  std::vector<v1::Job> jobs;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), jobs_family()));
  // Keys sort bytewise, so "job/<id>" records come out in job_id order.
  for (it->Seek(kJobKeyPrefix); it->Valid() && it->key().starts_with(kJobKeyPrefix); it->Next()) {
    const std::string key = it->key().ToString();
    v1::Job job;
    if (it->value().size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
        !job.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat("record \"", key, "\" in data dir ", data_dir_,
                                              " does not parse as cohort.v1.Job"));
    }
    if (key != absl::StrCat(kJobKeyPrefix, job.job_id())) {
      return absl::DataLossError(absl::StrCat("record \"", key, "\" in data dir ", data_dir_,
                                              " holds job_id \"", job.job_id(), "\""));
    }
    jobs.push_back(std::move(job));
  }
  RETURN_IF_ERROR(FromRocksDb(it->status(), data_dir_, "scan of jobs"));
  return jobs;
}

absl::StatusOr<int64_t> RocksDbJobStore::NextJobNumber() {
  absl::MutexLock lock(&counter_mu_);
  int64_t next = 1;
  std::string stored;
  rocksdb::Status read =
      db_->Get(rocksdb::ReadOptions(), jobs_family(), kNextJobNumberKey, &stored);
  if (read.ok()) {
    if (!absl::SimpleAtoi(stored, &next) || next < 1) {
      return absl::DataLossError(absl::StrCat("record \"", kNextJobNumberKey, "\" in data dir ",
                                              data_dir_, " holds \"", stored,
                                              "\", not a positive integer"));
    }
  } else if (!read.IsNotFound()) {
    return FromRocksDb(read, data_dir_, absl::StrCat("read of ", kNextJobNumberKey));
  }
  if (next == std::numeric_limits<int64_t>::max()) {
    return absl::ResourceExhaustedError("job numbers are exhausted");
  }
  RETURN_IF_ERROR(
      FromRocksDb(db_->Put(SyncWrite(), jobs_family(), kNextJobNumberKey, absl::StrCat(next + 1)),
                  data_dir_, absl::StrCat("write of ", kNextJobNumberKey)));
  return next;
}

}  // namespace cohort::coordinator
