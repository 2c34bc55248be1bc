#pragma once
// CheckpointStore: durable storage for sharded checkpoints (the format is in
// docs/checkpoint-format.md). A checkpoint is written as a *pending attempt*
// (job, step, generation): a durable marker, then chunks, invisible to
// readers; Commit makes it visible in one step by writing its manifest.
// Attempts that never commit (a crash, an abandoned upload) are found through
// their markers and dropped.
//
// Implementations: RocksDbCheckpointStore (coordinator/
// rocksdb_checkpoint_store.h) and InMemoryCheckpointStore (below, tests).
// CheckpointUploads (checkpoint_uploads.h) decides what to store and when to
// commit; this interface only stores.
//
// Thread-safety: implementations are thread-safe.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cohort/v1/checkpoints.pb.h"
#include "common/box.h"
#include "common/ids.h"

namespace cohort::coordinator {

struct PendingCheckpoint {
  JobId job;
  Step step;
  Generation generation;

  friend bool operator==(const PendingCheckpoint&, const PendingCheckpoint&) = default;
  friend auto operator<=>(const PendingCheckpoint&, const PendingCheckpoint&) = default;
};

std::string PendingName(const PendingCheckpoint& pending);  // "job demo-1 step 10 generation 2"

// The step a request names (GetManifest, Download): a negative one is the
// newest committed checkpoint (nullopt), as proto/README.md says.
inline std::optional<Step> StepOrNewest(int64_t requested) {
  return requested < 0 ? std::nullopt : std::optional<Step>(Step(requested));
}

// The bytes of one chunk as a store hands them out: a view of memory that
// this object, and every copy of it, keeps alive. A store may lend the
// buffer its read filled (RocksDB pins a blob in the buffer it read it into)
// rather than copy every byte once more; a download's messages then refer to
// that buffer until gRPC has sent them. The store must outlive it.
class ChunkBytes {
 public:
  ChunkBytes() = default;
  // `bytes` stays valid while `owner` lives.
  ChunkBytes(std::string_view bytes, std::shared_ptr<const void> owner)
      : owner_(std::move(owner)), view_(bytes) {}

  std::string_view view() const { return view_; }
  const char* data() const { return view_.data(); }
  size_t size() const { return view_.size(); }

 private:
  std::shared_ptr<const void> owner_;
  std::string_view view_;
};

// A committed checkpoint as of one moment: its manifest and chunks stay
// readable through this object even if the checkpoint is deleted meanwhile.
class CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;
  virtual const v1::CheckpointManifest& manifest() const = 0;
  // The bytes of chunk `chunk` of `tensor` (both from manifest()), verified
  // against the chunk's crc32c and size. DataLoss naming the checkpoint,
  // tensor and chunk when they do not match or the storage reports
  // corruption; Internal for other storage errors. Thread-safe: a download
  // reads several chunks at once.
  virtual absl::StatusOr<ChunkBytes> ReadChunk(const v1::TensorInfo& tensor,
                                               const v1::ChunkInfo& chunk) = 0;
};

class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;

  // Records durably that `pending` is being written, before any of its
  // chunks. Idempotent.
  virtual absl::Status BeginPending(const PendingCheckpoint& pending) = 0;
  // Stores one chunk of `pending` under (tensor, box start), replacing a
  // chunk stored under the same key (a retried upload). Not durable, and not
  // visible, until Commit.
  virtual absl::Status PutChunk(const PendingCheckpoint& pending, const std::string& tensor,
                                const Box& box, std::string_view bytes) = 0;
  // Makes the checkpoint of `manifest` (job, step, generation; every chunk
  // Put before) visible: chunks are made durable first, then the manifest
  // is written and the marker removed in one synced write. A committed
  // checkpoint of the same job and step from another generation is replaced
  // and its chunks freed.
  virtual absl::Status Commit(const v1::CheckpointManifest& manifest) = 0;
  // Deletes an uncommitted attempt's chunks and marker. Idempotent.
  virtual absl::Status DropPending(const PendingCheckpoint& pending) = 0;
  // Attempts with a marker (uncommitted): after a restart, abandoned ones.
  virtual absl::StatusOr<std::vector<PendingCheckpoint>> ListPending() = 0;

  // The job's committed manifests, newest step first.
  virtual absl::StatusOr<std::vector<v1::CheckpointManifest>> List(const JobId& job) = 0;
  // A reader of committed checkpoint `step` of `job` (nullopt: the newest).
  // NotFound when there is none.
  virtual absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const JobId& job, std::optional<Step> step) = 0;
  // Deletes a committed checkpoint and frees its bytes. NotFound if absent.
  virtual absl::Status Delete(const JobId& job, Step step) = 0;
  // The newest committed step of `job`, from memory (no I/O, so callers
  // may hold locks a heartbeat needs); nullopt when it has none.
  virtual std::optional<Step> NewestStep(const JobId& job) const = 0;
};

// Which steps of which jobs are committed: the stores' in-memory index.
// Thread-safe.
class CommittedIndex {
 public:
  void Add(const JobId& job, Step step);
  void Remove(const JobId& job, Step step);
  std::optional<Step> Newest(const JobId& job) const;

 private:
  mutable absl::Mutex mu_;
  std::map<JobId, std::set<Step>> steps_ ABSL_GUARDED_BY(mu_);
};

// OK when `bytes` are chunk `chunk` of `tensor` (size and crc32c);
// DataLoss naming the checkpoint, tensor and chunk otherwise.
absl::Status VerifyChunk(const v1::CheckpointManifest& manifest, const v1::TensorInfo& tensor,
                         const v1::ChunkInfo& chunk, std::string_view bytes);

// A CheckpointStore in memory, for tests. Readers share the chunk bytes, so
// a deleted checkpoint stays readable through a reader opened before.
class InMemoryCheckpointStore : public CheckpointStore {
 public:
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
  std::optional<Step> NewestStep(const JobId& job) const override;

  // Test hook: the number of stored chunks (committed or not).
  size_t chunk_count() const;

 private:
  using ChunkKey = std::tuple<PendingCheckpoint, std::string, std::vector<int64_t>>;
  class Reader;
  mutable absl::Mutex mu_;
  std::set<PendingCheckpoint> pending_ ABSL_GUARDED_BY(mu_);
  std::map<ChunkKey, std::shared_ptr<const std::string>> chunks_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int64_t>, v1::CheckpointManifest> manifests_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::coordinator
