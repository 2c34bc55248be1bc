#pragma once
// CheckpointClient: a worker's (or cohortctl's) side of the coordinator's
// Checkpoints service, at the level of the protos; no model code (workers map
// their tensors to chunks in worker/checkpoint). GrpcCheckpointClient is the
// real one; tests may implement the interface over an in-process store.
//
// Thread-safety: implementations are thread-safe (calls may run from the
// trainer and the background uploader at once).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cohort/v1/checkpoints.pb.h"
#include "common/box.h"
#include "common/message_limits.h"
#include "common/tls_credentials.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace cohort::client {

// One chunk to upload: a box of `tensor` and its bytes (row-major over the
// box), which the caller keeps alive during Upload.
struct UploadChunk {
  std::string tensor;
  Box box;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Called once per downloaded chunk, in arrival order, with its verified
// bytes. An error stops the download and is returned.
using ChunkCallback = std::function<absl::Status(const std::string& tensor,
                                                 const v1::ChunkInfo& info, std::string_view bytes)>;
// Asked when a chunk's header arrives: a buffer of info.bytes() bytes to
// receive the chunk directly, sparing a copy through the client's own
// buffer, or nullptr for that buffer. The ChunkCallback then gets bytes in
// that buffer. A chunk that fails its check leaves the buffer partly written.
using ChunkPlacement = std::function<void*(const std::string& tensor, const v1::ChunkInfo& info)>;

class CheckpointClient {
 public:
  virtual ~CheckpointClient() = default;

  // Uploads one writer's part: header, the chunks (crc32c computed here),
  // end. Returns the coordinator's response (committed: this writer
  // completed the checkpoint). Errors: those of the Upload RPC
  // (proto/cohort/v1/checkpoints.proto), DeadlineExceeded after `timeout`.
  virtual absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                                    const std::vector<UploadChunk>& chunks,
                                                    const v1::UploadEnd& end,
                                                    absl::Duration timeout) = 0;
  // The manifest of committed checkpoint `step` (-1: the newest). NotFound
  // when there is none.
  virtual absl::StatusOr<v1::CheckpointManifest> GetManifest(const std::string& job_id,
                                                             int64_t step,
                                                             absl::Duration timeout) = 0;
  // Streams the chunks `refs` names (all when empty), checking each one's
  // size and crc32c against what the server sends (DataLoss naming tensor
  // and chunk), and hands each to `on_chunk`; each goes where `place` says
  // (when it is set).
  virtual absl::Status Download(const std::string& job_id, int64_t step,
                                const std::vector<v1::ChunkRef>& refs, const ChunkPlacement& place,
                                const ChunkCallback& on_chunk, absl::Duration timeout) = 0;
  absl::Status Download(const std::string& job_id, int64_t step,
                        const std::vector<v1::ChunkRef>& refs, const ChunkCallback& on_chunk,
                        absl::Duration timeout) {
    return Download(job_id, step, refs, nullptr, on_chunk, timeout);
  }
  virtual absl::StatusOr<v1::ListCheckpointsResponse> List(const std::string& job_id,
                                                           absl::Duration timeout) = 0;
  virtual absl::Status Delete(const std::string& job_id, int64_t step,
                              absl::Duration timeout) = 0;
};

// A client over `channel` (shared; may be the agent's). With
// `wait_for_ready` a call waits (up to its timeout) for a coordinator that is
// not reachable yet, e.g. one restarting; without, it fails at once
// (Unavailable), as a command-line tool wants.
std::unique_ptr<CheckpointClient> NewGrpcCheckpointClient(std::shared_ptr<grpc::Channel> channel,
                                                          bool wait_for_ready);
// A client with its own channel to `address` (host:port) that waits for it.
std::unique_ptr<CheckpointClient> NewGrpcCheckpointClient(const CoordinatorTarget& target);

}  // namespace cohort::client
