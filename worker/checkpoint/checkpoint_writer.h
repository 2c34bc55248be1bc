#pragma once
// CheckpointWriter: one rank's asynchronous checkpoint saves.
//
//   Save(step, state)   at a step boundary: waits for the previous upload
//                       if it is still running (at most one in flight),
//                       copies the rank's share of the state (weights and
//                       AdamW moments of its write range, shard_plan.h)
//                       into a host buffer allocated once, and returns;
//                       training resumes at once
//   background thread   uploads the copy's chunks to the coordinator as
//                       this rank's writer stream; the last writer's
//                       upload commits the checkpoint
//   Wait()              blocks until the in-flight upload ends
//
// An upload that fails is logged and counted; training goes on and the next
// interval tries again. ResourceExhausted (the coordinator is busy) is
// retried with backoff; Aborted (a stale generation) is not.
//
// Thread-safety: Save and Wait from one thread (the training loop); the
// getters from any thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/ids.h"
#include "client/checkpoint_client.h"
#include "worker/checkpoint/shard_plan.h"

namespace cohort::checkpoint {

struct UploadResult {
  Step step;
  absl::Status status;
  bool committed = false;  // this writer completed the checkpoint
  uint64_t bytes = 0;
  absl::Duration duration;
};

struct CheckpointWriterOptions {
  std::string job_id;
  Generation generation;
  uint32_t writer = 0;  // global rank
  RankPosition position;
  bool zero1 = false;
  int64_t max_chunk_elements = 4 << 20;  // 16 MiB of fp32
  absl::Duration upload_timeout = absl::Minutes(10);
  int busy_retries = 5;  // ResourceExhausted retries, backoff 0.5 s doubling
  // Called on the upload thread when an upload ends (metrics).
  std::function<void(const UploadResult&)> on_result;
};

// The rank's training state at a step boundary. `adam_m` and `adam_v` hold
// the optimizer range [optimizer.begin, optimizer.end) of the arena.
struct StateView {
  const float* params = nullptr;
  const float* adam_m = nullptr;
  const float* adam_v = nullptr;
  ArenaRange optimizer;
};


class CheckpointWriter {
 public:
  // `client` must outlive the writer. `table` is the rank's ParameterTable.
  CheckpointWriter(client::CheckpointClient* client, const model::GptConfig& config,
                   const model::ParameterTable& table, CheckpointWriterOptions options);
  // Waits for the in-flight upload.
  ~CheckpointWriter();

  // Snapshots `state` for checkpoint `step` and starts its upload. Returns
  // how long the caller was blocked (waiting for the previous upload plus
  // the copy). InvalidArgument if the optimizer range does not contain the
  // write range.
  absl::StatusOr<absl::Duration> Save(Step step, const StateView& state);
  // Starts the upload of checkpoint `step` from `snapshot`: the weights of
  // `covers` (which must be this writer's write range), then its first and
  // its second moments, back to back (a train::DeviceSnapshot's host copy).
  // The upload's thread first calls `ready` (the snapshot's drain) and
  // uploads nothing when it fails, which counts as a failed upload with its
  // status. `snapshot` must stay as it is until the upload ends (Wait).
  // Returns how long the caller was blocked (the previous upload).
  // InvalidArgument when `covers` is not the write range.
  absl::StatusOr<absl::Duration> SaveDrained(Step step, const float* snapshot, ArenaRange covers,
                                             std::function<absl::Status()> ready);
  // The arena elements this rank writes.
  ArenaRange write_range() const { return range_; }
  // Blocks until no upload is in flight; returns the last upload's result.
  UploadResult Wait();

  // Results of uploads so far.
  int64_t uploads_ok() const;
  int64_t uploads_failed() const;
  std::optional<UploadResult> last_result() const;
  // Bytes this rank writes per checkpoint.
  uint64_t bytes_per_checkpoint() const { return 3 * (range_.end - range_.begin) * sizeof(float); }

 private:
  // Uploads `data` (the write range's weights, first and second moments,
  // back to back) once `ready` (may be empty) returns OK.
  void Upload(Step step, const float* data, const std::function<absl::Status()>& ready);
  // Logs an upload's result, counts it and hands it to options_.on_result.
  void Record(const UploadResult& result);

  client::CheckpointClient* const client_;
  const CheckpointWriterOptions options_;
  const ArenaRange range_;
  const std::vector<SavePiece> pieces_;
  const std::vector<v1::TensorInfo> catalog_;
  const std::string fingerprint_;
  // Save's snapshot: the write range of params, m and v, back to back
  // (allocated at the first Save: SaveDrained's caller brings its own).
  std::vector<float> snapshot_;
  std::thread uploader_;

  mutable absl::Mutex mu_;
  int64_t ok_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<UploadResult> last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::checkpoint
