#pragma once
// The order and sizes of the messages of one Checkpoints.Upload stream:
// one UploadHeader, then per chunk a ChunkHeader followed by data messages
// that add up to exactly its bytes, then UploadEnd. Checked before anything
// is allocated or stored, so a peer cannot make the coordinator reserve more
// than the chunk limit (sizes compared unsigned: 2^63 must not pass as
// negative). One class for the gRPC reactor and the fuzzer, so the fuzzer
// exercises the checks the server makes. Not thread-safe.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cohort/v1/checkpoints.pb.h"

namespace cohort::coordinator {

class UploadFraming {
 public:
  explicit UploadFraming(int64_t max_chunk_bytes) : max_chunk_bytes_(max_chunk_bytes) {}

  // An UploadHeader; only the first is allowed.
  absl::Status OnHeader();
  // A ChunkHeader: after the header, not inside another chunk, 1 to
  // max_chunk_bytes bytes. On OK, chunk() is it and data may follow.
  absl::Status OnChunk(const v1::ChunkHeader& chunk);
  // A data message of `size` bytes: true when it completes the chunk.
  absl::StatusOr<bool> OnData(size_t size);
  // UploadEnd: after the header, outside a chunk.
  absl::Status OnEnd() const;

  const v1::ChunkHeader& chunk() const { return chunk_; }
  bool in_chunk() const { return in_chunk_; }

 private:
  int64_t max_chunk_bytes_;
  bool header_ = false;
  bool in_chunk_ = false;
  v1::ChunkHeader chunk_;
  uint64_t received_ = 0;  // of chunk_
};

}  // namespace cohort::coordinator
