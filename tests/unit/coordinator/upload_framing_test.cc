// The framing checks of a Checkpoints.Upload stream, made before anything
// is allocated (issue 21, found 1: a chunk of 2^63 bytes passed a signed
// size check and wedged the call).

#include "coordinator/checkpoints/upload_framing.h"

#include <cstdint>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

v1::ChunkHeader Chunk(uint64_t bytes) {
  v1::ChunkHeader chunk;
  chunk.set_tensor("param/x");
  chunk.set_bytes(bytes);
  return chunk;
}

TEST(UploadFramingTest, AWellFormedStreamPasses) {
  UploadFraming framing(1 << 20);
  ASSERT_TRUE(framing.OnHeader().ok());
  ASSERT_TRUE(framing.OnChunk(Chunk(10)).ok());
  EXPECT_TRUE(framing.in_chunk());
  EXPECT_EQ(framing.OnData(4).value(), false);
  EXPECT_EQ(framing.OnData(6).value(), true);
  EXPECT_FALSE(framing.in_chunk());
  ASSERT_TRUE(framing.OnChunk(Chunk(1 << 20)).ok()) << "the limit itself is allowed";
  EXPECT_EQ(framing.OnData(1 << 20).value(), true);
  EXPECT_TRUE(framing.OnEnd().ok());
}

TEST(UploadFramingTest, SizesAtOrAboveTwoToTheSixtyThreeAreOverTheLimit) {
  for (uint64_t bytes : {uint64_t{1} << 63, (uint64_t{1} << 63) + 1,
                         std::numeric_limits<uint64_t>::max(), uint64_t{(1 << 20) + 1}}) {
    UploadFraming framing(1 << 20);
    ASSERT_TRUE(framing.OnHeader().ok());
    absl::Status status = framing.OnChunk(Chunk(bytes));
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << bytes;
    EXPECT_THAT(status.message(), HasSubstr("--max_checkpoint_chunk_bytes")) << bytes;
    EXPECT_FALSE(framing.in_chunk());
  }
}

TEST(UploadFramingTest, MessagesOutOfOrderOrOfTheWrongSizeAreInvalid) {
  UploadFraming framing(100);
  EXPECT_EQ(framing.OnChunk(Chunk(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(framing.OnEnd().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(framing.OnData(1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(framing.OnHeader().ok());
  EXPECT_THAT(framing.OnHeader().message(), HasSubstr("a second UploadHeader"));
  EXPECT_THAT(framing.OnChunk(Chunk(0)).message(), HasSubstr("must be > 0"));
  ASSERT_TRUE(framing.OnChunk(Chunk(8)).ok());
  EXPECT_THAT(framing.OnChunk(Chunk(8)).message(), HasSubstr("begins before the previous one"));
  EXPECT_THAT(framing.OnEnd().message(), HasSubstr("UploadEnd inside the chunk"));
  ASSERT_EQ(framing.OnData(5).value(), false);
  EXPECT_THAT(framing.OnData(4).status().message(), HasSubstr("more data than its 8 bytes"));
  // A data message larger than the whole chunk does not wrap around.
  EXPECT_EQ(framing.OnData(std::numeric_limits<size_t>::max()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(framing.OnData(3).value(), true);
}

}  // namespace
}  // namespace cohort::coordinator
