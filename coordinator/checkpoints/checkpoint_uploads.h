#pragma once
// CheckpointUploads: the coordinator's side of checkpoint writing. It takes
// each writer's stream of chunks (Begin, AddChunk..., End), stores them as a
// pending attempt in the CheckpointStore, and commits the checkpoint when
// the last writer of the generation has ended and the chunks cover every
// element of every declared tensor exactly once (checkpoint_coverage.h).
// After a commit it applies the job's retention policy.
//
//   Begin(header)            a writer opens; the attempt (job, step,
//                            generation) is created by its first writer
//   AddChunk(chunk, bytes)   checked against the declared tensors, crc32c
//                            verified, stored (outside the lock)
//   End(end)                 the writer is done; the last one commits
//   Abort()                  the stream broke: the writer may begin again
//
// Fencing: every writer's generation must be the job's current one, checked
// at Begin and again before the commit (Aborted otherwise). An attempt is
// abandoned (its chunks dropped) when its job moves to a newer generation,
// when a newer checkpoint of the job commits, when it sees no activity for
// `abandon_after`, or when it fails its coverage check.
//
// Failures: an attempt fails when the store refuses a write of it (its
// marker, a chunk, the commit: kind STORAGE), when its chunks do not cover
// the tensors at the commit (INCOMPLETE), or when its writers go idle for
// `abandon_after` while the job still takes checkpoints (ABANDONED). Each is
// told to Options::on_failure, once per (job, step, generation). An attempt
// given up because the job moved on (a stale generation, a newer step
// committed first, the job finished or gone) is no failure: elastic re-plans
// cause those.
//
// Thread-safe. Store I/O happens outside the internal lock, so writers of
// different checkpoints, and of the same one, proceed in parallel.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cohort/v1/checkpoints.pb.h"
#include "cohort/v1/job.pb.h"
#include "common/clock.h"
#include "common/ids.h"
#include "coordinator/checkpoints/checkpoint_store.h"
#include "coordinator/checkpoints/upload_rules.h"

namespace cohort::coordinator {

// What the uploads need to know about a job, from the JobManager.
struct CheckpointJobState {
  Generation generation;
  v1::CheckpointPolicy policy;
  bool accepts_checkpoints = true;  // false once cancelled or failed
  // COMPLETED, FAILED or CANCELLED: an attempt its writers leave idle then
  // is no failure (they stopped with the job).
  bool finished = false;
  // The generation's mesh degrees (0: not known, not checked). An upload's
  // layout, and with it its writer count, must be this mesh's: a client
  // cannot make the coordinator wait for writers that do not exist.
  int data_parallel = 0, tensor_parallel = 0, pipeline_parallel = 0;
};
using CheckpointJobLookup = std::function<absl::StatusOr<CheckpointJobState>(const JobId&)>;

// A checkpoint attempt that failed (see the class comment).
struct FailedCheckpoint {
  PendingCheckpoint attempt;
  v1::CheckpointFailureKind kind = v1::CHECKPOINT_FAILURE_KIND_UNSPECIFIED;
  // The store's message (e.g. "RocksDB write of ... failed: IO error: No
  // space left on device: ..."), the coverage check's, or how long the
  // writers were idle. Unbounded: the receiver bounds what it keeps.
  std::string reason;
  absl::Time time;
};

// A checkpoint that committed.
struct CommittedCheckpoint {
  PendingCheckpoint attempt;
  absl::Time time;  // the manifest's committed_unix_ms
};

struct CheckpointUploadsOptions {
  int64_t max_chunk_bytes = 64 << 20;
  int max_tensors = 4096;
  absl::Duration abandon_after = absl::Minutes(10);
  // Runs the retention that follows a commit; unset: inline, before the
  // committing writer's End returns. Must run what it is given (it may run
  // after End returned, while this object lives).
  std::function<void(std::function<void()>)> defer;
  // Told of every failed attempt (at most once per job, step and
  // generation) and every commit; unset: nobody. Called without the
  // internal lock, on the thread of the call that failed or committed (a
  // writer's Begin, AddChunk or End, or Tick), before that call returns: a
  // slow callback delays that writer's reply, so it may take other locks
  // (the coordinator's) but should not wait on uploads.
  std::function<void(const FailedCheckpoint&)> on_failure;
  std::function<void(const CommittedCheckpoint&)> on_commit;
};


struct UploadCounters {
  int64_t chunks = 0;
  int64_t bytes = 0;
  int64_t commits = 0;
  int64_t abandoned = 0;
  int64_t retired = 0;
};

class CheckpointUploads {
 public:
  class Writer;

  // `store` and `clock` must outlive this object.
  CheckpointUploads(CheckpointStore* store, CheckpointJobLookup jobs, const Clock* clock,
                    CheckpointUploadsOptions options = {});
  ~CheckpointUploads();

  // Drops the attempts a previous process left uncommitted (call once at
  // start, before any upload). Returns how many.
  absl::StatusOr<int> CollectAbandoned();

  // Opens a writer. InvalidArgument for a malformed header (naming the
  // field), NotFound for an unknown job, Aborted for a generation that is
  // not the job's current one, FailedPrecondition for a job that takes no
  // checkpoints or a writer that already ended this attempt, AlreadyExists
  // when this (job, step) is already committed by this generation.
  absl::StatusOr<std::unique_ptr<Writer>> Begin(const v1::UploadHeader& header);

  // Periodic: abandons attempts of stale generations and idle ones.
  void Tick();

  UploadCounters counters() const;
  int pending_attempts() const;

 private:
  struct Attempt;
  friend class Writer;

  absl::Status AddChunk(Writer* writer, const v1::ChunkHeader& chunk, std::string_view bytes,
                        uint32_t crc32c);
  absl::StatusOr<bool> End(Writer* writer, const v1::UploadEnd& end);
  void Abort(Writer* writer);
  // Commits a complete attempt (taken out of the map), then retires old
  // checkpoints. Runs without the lock.
  absl::Status CommitAttempt(std::shared_ptr<Attempt> attempt);
  // Deletes the committed checkpoints of `job` that `policy` no longer keeps.
  void Retire(const JobId& job, const v1::CheckpointPolicy& policy);
  // Marks `attempt` abandoned; returns whether the caller must drop its
  // chunks now (no store write of it in flight).
  bool AbandonLocked(const std::shared_ptr<Attempt>& attempt, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes an abandoned attempt's chunks and marker (without the lock).
  void Drop(const std::shared_ptr<Attempt>& attempt);
  // Abandons and drops an attempt whose commit failed; a `kind` other than
  // UNSPECIFIED reports it as a failure, with `reason` (empty: `why`).
  void Fail(const std::shared_ptr<Attempt>& attempt, const std::string& why,
            v1::CheckpointFailureKind kind = v1::CHECKPOINT_FAILURE_KIND_UNSPECIFIED,
            std::string reason = "");
  // A failure of `key` to report: set unless one of `key` was reported
  // already (each attempt counts once, however many of its writers fail).
  std::optional<FailedCheckpoint> FailureLocked(const PendingCheckpoint& key,
                                                v1::CheckpointFailureKind kind, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells options_.on_failure of `failure`, if set (without the lock).
  void Report(const std::optional<FailedCheckpoint>& failure) ABSL_LOCKS_EXCLUDED(mu_);

  CheckpointStore* const store_;
  const CheckpointJobLookup jobs_;
  const Clock* const clock_;
  const CheckpointUploadsOptions options_;

  mutable absl::Mutex mu_;
  std::map<PendingCheckpoint, std::shared_ptr<Attempt>> attempts_ ABSL_GUARDED_BY(mu_);
  // Attempts abandoned whose chunks are not deleted yet: no new attempt with
  // their key may start until they are.
  std::set<PendingCheckpoint> dropping_ ABSL_GUARDED_BY(mu_);
  UploadCounters counters_ ABSL_GUARDED_BY(mu_);
  // Attempts whose failure was reported, oldest first, the newest
  // kRememberedFailures of them: a writer retrying an attempt that failed
  // (whose marker write failed, say) does not count it again.
  static constexpr size_t kRememberedFailures = 1024;
  std::set<PendingCheckpoint> reported_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingCheckpoint> reported_order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_writer_serial_ ABSL_GUARDED_BY(mu_) = 1;
};

// One writer's stream. AddChunk may run concurrently with other AddChunks
// of the same writer (a stream pipelines its chunks); End must come after
// every AddChunk returned. Destroying it without End counts as Abort.
class CheckpointUploads::Writer {
 public:
  ~Writer();
  // Stores one chunk. InvalidArgument for an undeclared tensor, a box outside
  // its shape or a size that does not match the box; ResourceExhausted for a
  // chunk over the limit; DataLoss when the crc32c does not match; Aborted
  // when the attempt was abandoned; the store's errors.
  absl::Status AddChunk(const v1::ChunkHeader& chunk, std::string_view bytes);
  // The same with the CRC-32C of `bytes` computed by the caller, who had
  // them in cache as they arrived; it is checked against the chunk's.
  absl::Status AddChunk(const v1::ChunkHeader& chunk, std::string_view bytes,
                        uint32_t crc32c_of_bytes);
  // Ends the writer: true if it completed and committed the checkpoint.
  // InvalidArgument when end.chunks differs from the chunks received;
  // FailedPrecondition when the chunks do not cover the tensors (the attempt
  // is dropped); Aborted when the generation is stale by now.
  absl::StatusOr<bool> End(const v1::UploadEnd& end);
  uint32_t chunks_stored() const { return chunks_.load(); }
  const PendingCheckpoint& key() const { return key_; }

 private:
  friend class CheckpointUploads;
  Writer(CheckpointUploads* owner, std::shared_ptr<Attempt> attempt, PendingCheckpoint key,
         uint32_t rank, uint64_t serial)
      : owner_(owner), attempt_(std::move(attempt)), key_(std::move(key)), rank_(rank),
        serial_(serial) {}
  CheckpointUploads* owner_;
  std::shared_ptr<Attempt> attempt_;
  PendingCheckpoint key_;
  uint32_t rank_;
  uint64_t serial_;
  std::atomic<uint32_t> chunks_{0};
  bool ended_ = false;
};

}  // namespace cohort::coordinator
