#pragma once
// RocksDbCheckpointStore: CheckpointStore in its own RocksDB database
// (<data dir>/checkpoints), apart from the job records so that tensor bytes
// never slow the synced job writes. Key schema and options:
// docs/checkpoint-format.md. In short:
//
//   column family "manifests": job \0 step(8)            -> CheckpointManifest
//   column family "pending":   job \0 step(8) gen(8)     -> "" (attempt marker)
//   column family "chunks":    job \0 step(8) gen(8) tensor \0 start(8)...
//                                                        -> the chunk's bytes
//
// (integers big-endian, so keys sort numerically). Chunk values live in blob
// files (integrated BlobDB), so compaction moves keys, not tensor bytes.
// Chunks are written without the WAL and made durable by a flush at commit;
// markers and manifests are synced writes.
//
// Thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/checkpoints/checkpoint_store.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace cohort::coordinator {

struct RocksDbCheckpointStoreOptions {
  // Memtable size for chunks; up to `max_write_buffers` of them are held
  // while flushes run, which bounds the store's memory for uploads.
  size_t write_buffer_bytes = 64 << 20;
  int max_write_buffers = 4;
  size_t blob_file_bytes = 256 << 20;
  // Memtable flushes that may run at once (see Open).
  int flush_threads = 2;
  // O_DIRECT for flushes, compactions and reads (see Open).
  bool direct_io = true;
};

class RocksDbCheckpointStore : public CheckpointStore {
 public:
  // Opens or creates the database in `dir`. Unavailable if another process
  // holds it; DataLoss on corruption; Internal otherwise (messages name dir).
  static absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> Open(
      const std::string& dir, const RocksDbCheckpointStoreOptions& options = {});
  ~RocksDbCheckpointStore() override;

  absl::Status BeginPending(const PendingCheckpoint& pending) override;
  absl::Status PutChunk(const PendingCheckpoint& pending, const std::string& tensor,
                        const Box& box, std::string_view bytes) override;
  absl::Status Commit(const v1::CheckpointManifest& manifest) override;
  absl::Status DropPending(const PendingCheckpoint& pending) override;
  absl::StatusOr<std::vector<PendingCheckpoint>> ListPending() override;
  absl::StatusOr<std::vector<v1::CheckpointManifest>> List(const JobId& job) override;
  absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const JobId& job,
                                                         std::optional<Step> step) override;
  absl::Status Delete(const JobId& job, Step step) override;
  std::optional<Step> NewestStep(const JobId& job) const override {
    return committed_.Newest(job);
  }

  // Bytes of the live SST and blob files (what the directory holds, minus
  // logs and obsolete files not yet removed).
  absl::StatusOr<uint64_t> LiveBytes() const;

  // The chunk key of (pending, tensor, box start): for tests that tamper
  // with stored bytes.
  static std::string ChunkKey(const PendingCheckpoint& pending, const std::string& tensor,
                              const std::vector<int64_t>& start);
  rocksdb::DB* db() const { return db_.get(); }
  rocksdb::ColumnFamilyHandle* chunks_family() const { return handles_[3]; }

 private:
  class Reader;
  explicit RocksDbCheckpointStore(std::string dir);
  rocksdb::ColumnFamilyHandle* manifests_family() const { return handles_[1]; }
  rocksdb::ColumnFamilyHandle* pending_family() const { return handles_[2]; }
  // Deletes the chunks of one attempt and compacts their key range so that
  // their blob files can be freed.
  absl::Status DeleteChunks(const PendingCheckpoint& attempt);

  const std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // default, manifests, pending, chunks
  CommittedIndex committed_;  // loaded at Open, kept by Commit and Delete
};

}  // namespace cohort::coordinator
