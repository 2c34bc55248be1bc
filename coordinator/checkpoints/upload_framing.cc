#include "coordinator/checkpoints/upload_framing.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/safe_text.h"

namespace cohort::coordinator {

absl::Status UploadFraming::OnHeader() {
  if (header_) return absl::InvalidArgumentError("a second UploadHeader");
  header_ = true;
  return absl::OkStatus();
}

absl::Status UploadFraming::OnChunk(const v1::ChunkHeader& chunk) {
  if (!header_) return absl::InvalidArgumentError("a chunk before the header");
  if (in_chunk_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", Quoted(chunk.tensor()), " begins before the previous one (",
        Quoted(chunk_.tensor()), ") received its ", chunk_.bytes(), " bytes"));
  }
  const uint64_t limit = static_cast<uint64_t>(std::max<int64_t>(0, max_chunk_bytes_));
  if (chunk.bytes() > limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("chunk.bytes: a chunk of ", Quoted(chunk.tensor()), " has ", chunk.bytes(),
                     " bytes, over the limit of ", max_chunk_bytes_,
                     " (--max_checkpoint_chunk_bytes)"));
  }
  if (chunk.bytes() == 0) return absl::InvalidArgumentError("chunk.bytes: must be > 0");
  chunk_ = chunk;
  in_chunk_ = true;
  received_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> UploadFraming::OnData(size_t size) {
  if (!in_chunk_) return absl::InvalidArgumentError("data outside a chunk");
  if (size > chunk_.bytes() - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", Quoted(chunk_.tensor()), ": more data than its ", chunk_.bytes(), " bytes"));
  }
  received_ += size;
  if (received_ < chunk_.bytes()) return false;
  in_chunk_ = false;
  return true;
}

absl::Status UploadFraming::OnEnd() const {
  if (!header_) return absl::InvalidArgumentError("UploadEnd before the header");
  if (in_chunk_) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadEnd inside the chunk of ", Quoted(chunk_.tensor())));
  }
  return absl::OkStatus();
}

}  // namespace cohort::coordinator
