#include "coordinator/store/rocksdb_checkpoint_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/store/rocksdb_status.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/snapshot.h"
#include "rocksdb/write_batch.h"

namespace cohort::coordinator {
namespace {

constexpr char kManifests[] = "manifests";
constexpr char kPending[] = "pending";
constexpr char kChunks[] = "chunks";

void AppendBigEndian(std::string* out, uint64_t value) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
}

uint64_t ReadBigEndian(std::string_view bytes) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

// job \0: the NUL sorts below every id character, so one job's keys never
// interleave with those of a job whose id extends it ("a-1" and "a-10").
std::string JobPrefix(const JobId& job) { return absl::StrCat(job.value(), std::string(1, '\0')); }

std::string ManifestKey(const JobId& job, Step step) {
  std::string key = JobPrefix(job);
  AppendBigEndian(&key, static_cast<uint64_t>(step.value()));
  return key;
}

std::string AttemptKey(const PendingCheckpoint& pending) {
  std::string key = ManifestKey(pending.job, pending.step);
  AppendBigEndian(&key, pending.generation.value());
  return key;
}

// The first key after every chunk of `pending` (its generation + 1).
std::string AttemptEnd(const PendingCheckpoint& pending) {
  return AttemptKey(PendingCheckpoint{pending.job, pending.step,
                                      Generation(pending.generation.value() + 1)});
}

absl::StatusOr<PendingCheckpoint> ParseAttemptKey(std::string_view key) {
  const size_t nul = key.find('\0');
  if (nul == std::string_view::npos || key.size() != nul + 1 + 16) {
    return absl::DataLossError(absl::StrCat("malformed checkpoint marker key of ", key.size(),
                                            " bytes"));
  }
  return PendingCheckpoint{JobId(std::string(key.substr(0, nul))),
                           Step(static_cast<int64_t>(ReadBigEndian(key.substr(nul + 1, 8)))),
                           Generation(ReadBigEndian(key.substr(nul + 9, 8)))};
}

rocksdb::WriteOptions Synced() {
  rocksdb::WriteOptions options;
  options.sync = true;
  return options;
}

rocksdb::ReadOptions ChunkRead(const rocksdb::Snapshot* snapshot) {
  rocksdb::ReadOptions options;
  // Every chunk is checked against the manifest's crc32c after the read
  // (hardware CRC); RocksDB's own blob check would compute a second CRC of
  // the same bytes, in software in Debian's portable build (it was 20% of the
  // coordinator's CPU during loads). SST blocks (keys) are still verified.
  options.verify_checksums = false;
  options.fill_cache = false;  // each chunk is read once per load; keep the cache for keys
  options.snapshot = snapshot;
  return options;
}

// Whether files in `dir` can be opened with O_DIRECT (tmpfs, for one,
// refuses it, and RocksDB would then fail its first flush).
bool SupportsDirectIo(const std::string& dir) {
  const std::string probe = dir + "/.direct-io-probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

}  // namespace

std::string RocksDbCheckpointStore::ChunkKey(const PendingCheckpoint& pending,
                                             const std::string& tensor,
                                             const std::vector<int64_t>& start) {
  std::string key = AttemptKey(pending);
  absl::StrAppend(&key, tensor, std::string(1, '\0'));
  for (int64_t s : start) AppendBigEndian(&key, static_cast<uint64_t>(s));
  return key;
}

// Reads through a RocksDB snapshot, so a concurrent Delete (and the
// compaction after it) cannot take the chunks away mid-read.
class RocksDbCheckpointStore::Reader : public CheckpointReader {
 public:
  Reader(const RocksDbCheckpointStore* store, const rocksdb::Snapshot* snapshot,
         v1::CheckpointManifest manifest)
      : store_(store), snapshot_(snapshot), manifest_(std::move(manifest)) {}
  ~Reader() override { store_->db_->ReleaseSnapshot(snapshot_); }

  const v1::CheckpointManifest& manifest() const override { return manifest_; }

  absl::StatusOr<ChunkBytes> ReadChunk(const v1::TensorInfo& tensor,
                                       const v1::ChunkInfo& chunk) override {
    const PendingCheckpoint attempt{JobId(manifest_.job_id()), Step(manifest_.step()),
                                    Generation(manifest_.generation())};
    const std::string key = ChunkKey(
        attempt, tensor.name(),
        std::vector<int64_t>(chunk.box().start().begin(), chunk.box().start().end()));
    // Into a PinnableSlice, which keeps the blob in the buffer RocksDB read
    // it into: the std::string overload copies it once more (a fifth of the
    // coordinator's CPU during a restore).
    auto bytes = std::make_shared<rocksdb::PinnableSlice>();
    rocksdb::Status status =
        store_->db_->Get(ChunkRead(snapshot_), store_->chunks_family(), key, bytes.get());
    const std::string where = absl::StrCat("checkpoint of job ", manifest_.job_id(), " step ",
                                           manifest_.step(), ": tensor ", tensor.name(),
                                           " chunk ", chunk.index());
    if (status.IsNotFound()) return absl::DataLossError(absl::StrCat(where, " is missing"));
    if (status.IsCorruption()) {
      return absl::DataLossError(absl::StrCat(where, " is corrupt: ", status.ToString()));
    }
    RETURN_IF_ERROR(FromRocksDb(status, store_->dir_, absl::StrCat("read of ", where)));
    const std::string_view view(bytes->data(), bytes->size());
    RETURN_IF_ERROR(VerifyChunk(manifest_, tensor, chunk, view));
    return ChunkBytes(view, std::move(bytes));
  }

 private:
  const RocksDbCheckpointStore* store_;
  const rocksdb::Snapshot* snapshot_;
  const v1::CheckpointManifest manifest_;
};

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> RocksDbCheckpointStore::Open(
    const std::string& dir, const RocksDbCheckpointStoreOptions& options) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.keep_log_file_num = 10;
  // A flush is serial: it copies and checksums a buffer of records, then
  // waits for its O_DIRECT write, and the CPU idles meanwhile. Two flushes at
  // once keep the disk busy while the other one computes: a single thread
  // ingested 1.2 GB/s, two 1.6-1.8 GB/s on a disk that writes 1.7-1.9 GB/s
  // (2-core VM, 1.5 GB of 9.4 MB chunks). RocksDB runs flushes of one column
  // family in parallel and still installs their results in memtable order.
  db_options.max_background_flushes = options.flush_threads;
  db_options.max_background_compactions = 2;
  // Manifest writes are tiny and synced; the WAL never holds chunk bytes.
  db_options.max_total_wal_size = 64 << 20;
  const bool direct_io = options.direct_io && SupportsDirectIo(dir);
  if (options.direct_io && !direct_io) {
    LOG(WARNING) << dir << " does not support O_DIRECT; the checkpoint store uses the page cache";
  }
  if (direct_io) {
    // Flushes write blob files straight to the device: tensor bytes need not
    // linger in the page cache, and buffered writeback was the bottleneck
    // (dd on the same disk: 2.0 GB/s O_DIRECT, 0.34 GB/s buffered + fdatasync).
    db_options.use_direct_io_for_flush_and_compaction = true;
    db_options.use_direct_reads = true;
  }

  rocksdb::ColumnFamilyOptions small;  // manifests and markers
  rocksdb::ColumnFamilyOptions chunks;
  chunks.enable_blob_files = true;
  chunks.min_blob_size = 0;  // every chunk value in a blob file
  chunks.blob_file_size = options.blob_file_bytes;
  chunks.blob_compression_type = rocksdb::kNoCompression;  // fp32 state does not compress
  // No blob garbage collection: it relocates live tensor bytes out of old
  // blob files during compactions (11% of the coordinator's CPU in the
  // benchmark, and the rewriting BlobDB is here to avoid). Space comes back
  // without it: each commit flushes, so a blob file holds the chunks of the
  // checkpoints in flight at that time only, and RocksDB deletes it once
  // compaction has dropped the last key that references it (Delete and
  // DropPending compact their key range at once).
  chunks.enable_blob_garbage_collection = false;
  chunks.write_buffer_size = options.write_buffer_bytes;
  chunks.max_write_buffer_number = options.max_write_buffers;
  chunks.compression = rocksdb::kNoCompression;  // SSTs hold only keys and blob references

  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, small},
      {kManifests, small},
      {kPending, small},
      {kChunks, chunks},
  };
  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  RETURN_IF_ERROR(
      FromRocksDb(rocksdb::DB::Open(db_options, dir, families, &handles, &raw), dir, "open"));
  auto store = absl::WrapUnique(new RocksDbCheckpointStore(dir));
  store->db_.reset(raw);
  store->handles_ = std::move(handles);
  // The index of committed steps: one pass over the manifests.
  std::unique_ptr<rocksdb::Iterator> it(
      store->db_->NewIterator(rocksdb::ReadOptions(), store->manifests_family()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    v1::CheckpointManifest manifest;
    if (!manifest.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat("a checkpoint manifest in ", dir, " does not parse"));
    }
    store->committed_.Add(JobId(manifest.job_id()), Step(manifest.step()));
  }
  RETURN_IF_ERROR(FromRocksDb(it->status(), dir, "scan of checkpoint manifests"));
  it.reset();
  return store;
}

RocksDbCheckpointStore::RocksDbCheckpointStore(std::string dir) : dir_(std::move(dir)) {}

RocksDbCheckpointStore::~RocksDbCheckpointStore() { CloseRocksDb(db_, handles_, dir_); }

absl::Status RocksDbCheckpointStore::BeginPending(const PendingCheckpoint& pending) {
  return FromRocksDb(db_->Put(Synced(), pending_family(), AttemptKey(pending), ""), dir_,
                     absl::StrCat("write of the marker of ", PendingName(pending)));
}

absl::Status RocksDbCheckpointStore::PutChunk(const PendingCheckpoint& pending,
                                              const std::string& tensor, const Box& box,
                                              std::string_view bytes) {
  rocksdb::WriteOptions options;
  // Durability comes from the flush in Commit; logging tensor bytes in the
  // WAL as well would write them twice.
  options.disableWAL = true;
  // A batch per thread, reused: DB::Put would allocate (and page in) a new
  // chunk-sized buffer for every chunk.
  static thread_local rocksdb::WriteBatch batch;
  batch.Clear();
  const std::string where = absl::StrCat("write of a chunk of ", tensor, " for ", PendingName(pending));
  RETURN_IF_ERROR(FromRocksDb(batch.Put(chunks_family(), ChunkKey(pending, tensor, box.start),
                                        rocksdb::Slice(bytes.data(), bytes.size())),
                              dir_, where));
  absl::Status written = FromRocksDb(db_->Write(options, &batch), dir_, where);
  if (batch.GetDataSize() > (64u << 20)) batch = rocksdb::WriteBatch();  // do not keep outsized ones
  return written;
}

absl::Status RocksDbCheckpointStore::Commit(const v1::CheckpointManifest& manifest) {
  const PendingCheckpoint attempt{JobId(manifest.job_id()), Step(manifest.step()),
                                  Generation(manifest.generation())};
  const std::string name = PendingName(attempt);
  rocksdb::FlushOptions flush;
  flush.wait = true;
  RETURN_IF_ERROR(FromRocksDb(db_->Flush(flush, chunks_family()), dir_,
                              absl::StrCat("flush of the chunks of ", name)));
  // A committed checkpoint of the same step from another generation is
  // replaced: remember its chunks to free them after the commit.
  std::optional<PendingCheckpoint> replaced;
  std::string old;
  rocksdb::Status read = db_->Get(rocksdb::ReadOptions(), manifests_family(),
                                  ManifestKey(attempt.job, attempt.step), &old);
  if (read.ok()) {
    v1::CheckpointManifest previous;
    if (previous.ParseFromString(old) && previous.generation() != manifest.generation()) {
      replaced = PendingCheckpoint{attempt.job, attempt.step, Generation(previous.generation())};
    }
  } else if (!read.IsNotFound()) {
    return FromRocksDb(read, dir_, absl::StrCat("read of the manifest of ", name));
  }
  std::string value;
  if (!manifest.SerializeToString(&value)) {
    return absl::InternalError(absl::StrCat("cannot serialize the manifest of ", name));
  }
  rocksdb::WriteBatch batch;
  RETURN_IF_ERROR(FromRocksDb(
      batch.Put(manifests_family(), ManifestKey(attempt.job, attempt.step), value), dir_, "batch"));
  RETURN_IF_ERROR(FromRocksDb(batch.Delete(pending_family(), AttemptKey(attempt)), dir_, "batch"));
  RETURN_IF_ERROR(FromRocksDb(db_->Write(Synced(), &batch), dir_,
                              absl::StrCat("commit of ", name)));
  committed_.Add(attempt.job, attempt.step);
  if (replaced) {
    if (absl::Status s = DeleteChunks(*replaced); !s.ok()) {
      LOG(WARNING) << "freeing the replaced " << PendingName(*replaced) << ": " << s;
    }
  }
  return absl::OkStatus();
}

absl::Status RocksDbCheckpointStore::DeleteChunks(const PendingCheckpoint& attempt) {
  const std::string begin = AttemptKey(attempt);
  const std::string end = AttemptEnd(attempt);
  RETURN_IF_ERROR(FromRocksDb(
      db_->DeleteRange(rocksdb::WriteOptions(), chunks_family(), begin, end), dir_,
      absl::StrCat("delete of the chunks of ", PendingName(attempt))));
  // Compacting the range drops the keys, and with them every reference to
  // blob files that held only this attempt's bytes, which RocksDB then
  // deletes; shared blob files are reclaimed by blob garbage collection.
  rocksdb::CompactRangeOptions compact;
  compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  const rocksdb::Slice from(begin), to(end);
  return FromRocksDb(db_->CompactRange(compact, chunks_family(), &from, &to), dir_,
                     absl::StrCat("compaction after deleting ", PendingName(attempt)));
}

absl::Status RocksDbCheckpointStore::DropPending(const PendingCheckpoint& pending) {
  RETURN_IF_ERROR(DeleteChunks(pending));
  return FromRocksDb(db_->Delete(Synced(), pending_family(), AttemptKey(pending)), dir_,
                     absl::StrCat("delete of the marker of ", PendingName(pending)));
}

absl::StatusOr<std::vector<PendingCheckpoint>> RocksDbCheckpointStore::ListPending() {
  std::vector<PendingCheckpoint> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), pending_family()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ASSIGN_OR_RETURN(PendingCheckpoint pending, ParseAttemptKey(it->key().ToStringView()));
    out.push_back(std::move(pending));
  }
  RETURN_IF_ERROR(FromRocksDb(it->status(), dir_, "scan of checkpoint markers"));
  return out;
}

absl::StatusOr<std::vector<v1::CheckpointManifest>> RocksDbCheckpointStore::List(
    const JobId& job) {
  std::vector<v1::CheckpointManifest> out;
  const std::string prefix = JobPrefix(job);
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions(), manifests_family()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    v1::CheckpointManifest manifest;
    if (!manifest.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat("a checkpoint manifest of job ", job.value(), " in ",
                                              dir_, " does not parse"));
    }
    out.push_back(std::move(manifest));
  }
  RETURN_IF_ERROR(FromRocksDb(it->status(), dir_, "scan of checkpoint manifests"));
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> RocksDbCheckpointStore::Open(
    const JobId& job, std::optional<Step> step) {
  const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
  auto release = [&] { db_->ReleaseSnapshot(snapshot); };
  rocksdb::ReadOptions read;
  read.snapshot = snapshot;
  std::string value;
  rocksdb::Status status;
  if (step.has_value()) {
    status = db_->Get(read, manifests_family(), ManifestKey(job, *step), &value);
  } else {
    // The newest: the last key with the job's prefix.
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read, manifests_family()));
    it->SeekForPrev(ManifestKey(job, Step(std::numeric_limits<int64_t>::max())));
    if (it->Valid() && it->key().starts_with(JobPrefix(job))) {
      value = it->value().ToString();
    } else {
      status = it->status().ok() ? rocksdb::Status::NotFound() : it->status();
    }
  }
  if (status.IsNotFound()) {
    release();
    return absl::NotFoundError(!step.has_value()
                                   ? absl::StrCat("job ", job.value(), " has no checkpoint")
                                   : absl::StrCat("job ", job.value(),
                                                  " has no checkpoint at step ", step->value()));
  }
  if (!status.ok()) {
    release();
    return FromRocksDb(status, dir_, "read of a checkpoint manifest");
  }
  v1::CheckpointManifest manifest;
  if (!manifest.ParseFromString(value)) {
    release();
    return absl::DataLossError(absl::StrCat("the checkpoint manifest of job ", job.value(),
                                            " step ", step.has_value() ? step->value() : -1,
                                            " in ", dir_, " does not parse"));
  }
  return std::make_unique<Reader>(this, snapshot, std::move(manifest));
}

absl::Status RocksDbCheckpointStore::Delete(const JobId& job, Step step) {
  std::string value;
  rocksdb::Status read =
      db_->Get(rocksdb::ReadOptions(), manifests_family(), ManifestKey(job, step), &value);
  if (read.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat("job ", job.value(), " has no checkpoint at step ", step.value()));
  }
  RETURN_IF_ERROR(FromRocksDb(read, dir_, "read of a checkpoint manifest"));
  v1::CheckpointManifest manifest;
  if (!manifest.ParseFromString(value)) {
    return absl::DataLossError(absl::StrCat("the checkpoint manifest of job ", job.value(),
                                            " step ", step.value(), " does not parse"));
  }
  // The manifest goes first (synced): from then on the checkpoint is not
  // listed, and a crash before the chunks are gone leaves only unreachable
  // bytes, which a marker makes the next start collect.
  const PendingCheckpoint attempt{job, step, Generation(manifest.generation())};
  rocksdb::WriteBatch batch;
  RETURN_IF_ERROR(FromRocksDb(batch.Delete(manifests_family(), ManifestKey(job, step)), dir_, "batch"));
  RETURN_IF_ERROR(FromRocksDb(batch.Put(pending_family(), AttemptKey(attempt), ""), dir_, "batch"));
  RETURN_IF_ERROR(FromRocksDb(db_->Write(Synced(), &batch), dir_,
                              absl::StrCat("delete of checkpoint ", PendingName(attempt))));
  committed_.Remove(job, step);
  return DropPending(attempt);
}

absl::StatusOr<uint64_t> RocksDbCheckpointStore::LiveBytes() const {
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* handle : handles_) {
    uint64_t sst = 0, blob = 0;
    if (!db_->GetIntProperty(handle, rocksdb::DB::Properties::kLiveSstFilesSize, &sst) ||
        !db_->GetIntProperty(handle, rocksdb::DB::Properties::kLiveBlobFileSize, &blob)) {
      return absl::InternalError("RocksDB did not report its file sizes");
    }
    total += sst + blob;
  }
  return total;
}

}  // namespace cohort::coordinator
