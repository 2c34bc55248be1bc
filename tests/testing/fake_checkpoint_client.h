#pragma once
// RecordingCheckpointClient: a CheckpointClient with no checkpoint to give
// (GetManifest is NotFound, so a trainer starts fresh) that records the step
// of every upload (and its bytes) and commits it. For tests of the training loop and the
// trainer that need no Checkpoints service.
//
// Thread-safe (the writer uploads from its own thread).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/checkpoint_client.h"

namespace cohort::testing {

class RecordingCheckpointClient : public client::CheckpointClient {
 public:
  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                            const std::vector<client::UploadChunk>& chunks,
                                            const v1::UploadEnd&, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    steps_.push_back(header.step());
    std::string& payload = payloads_.emplace_back();
    for (const client::UploadChunk& chunk : chunks) {
      payload.append(static_cast<const char*>(chunk.data), chunk.bytes);
    }
    v1::UploadResponse response;
    response.set_chunks_stored(static_cast<uint32_t>(chunks.size()));
    response.set_committed(true);
    return response;
  }
  absl::StatusOr<v1::CheckpointManifest> GetManifest(const std::string& job, int64_t,
                                                     absl::Duration) override {
    return absl::NotFoundError(absl::StrCat("job ", job, " has no checkpoint"));
  }
  absl::Status Download(const std::string&, int64_t, const std::vector<v1::ChunkRef>&,
                        const client::ChunkPlacement&, const client::ChunkCallback&,
                        absl::Duration) override {
    return absl::UnimplementedError("no checkpoint is stored in this test");
  }
  absl::StatusOr<v1::ListCheckpointsResponse> List(const std::string&, absl::Duration) override {
    return v1::ListCheckpointsResponse();
  }
  absl::Status Delete(const std::string&, int64_t, absl::Duration) override {
    return absl::OkStatus();
  }
  // The steps uploaded so far, in order.
  std::vector<int64_t> steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  // Each upload's chunk bytes, concatenated in the order sent.
  std::vector<std::string> payloads() {
    absl::MutexLock lock(&mu_);
    return payloads_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> payloads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::testing
