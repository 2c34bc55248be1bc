// Regressions found by fuzz/coordinator_rpc_fuzzer.cc (docs/fuzzing.md):
// malformed Checkpoints.Upload messages from a worker must be refused with
// a status, never crash the coordinator. The fuzzer's inputs are in
// fuzz/corpus/coordinator_rpc_fuzzer/regression-*.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "common/box.h"
#include "common/clock.h"
#include "coordinator/checkpoints/checkpoint_store.h"
#include "coordinator/checkpoints/checkpoint_uploads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

class CheckpointUploadsFuzzRegressionTest : public ::testing::Test {
 protected:
  CheckpointUploadsFuzzRegressionTest()
      : uploads_(
            &store_,
            [](const JobId& job) -> absl::StatusOr<CheckpointJobState> {
              if (job.value() != "demo-1") return absl::NotFoundError("no job " + job.value());
              CheckpointJobState state;
              state.generation = Generation(1);
              return state;
            },
            &clock_) {}

  // One writer, one 2 x 3 fp32 tensor.
  static v1::UploadHeader Header() {
    v1::UploadHeader h;
    h.set_job_id("demo-1");
    h.set_generation(1);
    h.set_step(10);
    h.mutable_layout()->set_data_parallel(1);
    h.mutable_layout()->set_tensor_parallel(1);
    h.mutable_layout()->set_pipeline_parallel(1);
    h.set_writer(0);
    h.set_writers(1);
    v1::TensorInfo* t = h.add_tensors();
    t->set_name("param/wte");
    t->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
    t->add_global_shape(2);
    t->add_global_shape(3);
    return h;
  }

  static v1::ChunkHeader Chunk(std::initializer_list<int64_t> start,
                               std::initializer_list<int64_t> extent) {
    v1::ChunkHeader c;
    c.set_tensor("param/wte");
    for (int64_t s : start) c.mutable_box()->add_start(s);
    for (int64_t e : extent) c.mutable_box()->add_extent(e);
    c.set_bytes(12);
    return c;
  }

  FakeClock clock_;
  InMemoryCheckpointStore store_;
  CheckpointUploads uploads_;
};

// The fuzzer's first finding: a chunk box with fewer starts than extents.
// The refusal's message printed the box by extent count and read past the
// end of `start` (UBSan: reference binding to null pointer in BoxToString).
TEST_F(CheckpointUploadsFuzzRegressionTest, ChunkBoxWithFewerStartsThanExtents) {
  auto writer = uploads_.Begin(Header());
  ASSERT_TRUE(writer.ok()) << writer.status();
  const absl::Status s = (*writer)->AddChunk(Chunk({}, {1, 3}), std::string(12, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("chunk box start [] extent [1, 3] is empty or outside [2, 3]"));
  const absl::Status more = (*writer)->AddChunk(Chunk({0, 0, 0}, {1}), std::string(12, '\0'));
  EXPECT_EQ(more.code(), absl::StatusCode::kInvalidArgument) << more;
}

// A box whose end is past INT64_MAX: printing start + extent overflowed.
TEST_F(CheckpointUploadsFuzzRegressionTest, ChunkBoxEndingPastInt64Max) {
  auto writer = uploads_.Begin(Header());
  ASSERT_TRUE(writer.ok()) << writer.status();
  const int64_t max = std::numeric_limits<int64_t>::max();
  const absl::Status s = (*writer)->AddChunk(Chunk({max, 0}, {1, 3}), std::string(12, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("9223372036854775807:9223372036854775807+1"));
}

// Layout degrees whose product overflows: int32 in the refusal's message
// (65536 x 65536), int64 in the check itself (three times INT32_MAX).
TEST_F(CheckpointUploadsFuzzRegressionTest, LayoutDegreesWhoseProductOverflows) {
  v1::UploadHeader h = Header();
  h.mutable_layout()->set_data_parallel(65536);
  h.mutable_layout()->set_tensor_parallel(65536);
  auto refused = uploads_.Begin(h);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("header.writers: 1 is not data x tensor x pipeline = 65536 x 65536 x 1"));

  const int32_t max = std::numeric_limits<int32_t>::max();
  h.mutable_layout()->set_data_parallel(max);
  h.mutable_layout()->set_tensor_parallel(max);
  h.mutable_layout()->set_pipeline_parallel(max);
  h.set_writers(std::numeric_limits<uint32_t>::max());
  refused = uploads_.Begin(h);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);

  // A layout that does multiply out to writers is still accepted.
  h = Header();
  h.mutable_layout()->set_data_parallel(2);
  h.mutable_layout()->set_pipeline_parallel(3);
  h.set_writers(6);
  EXPECT_TRUE(uploads_.Begin(h).ok());
}

TEST(BoxToStringFuzzRegressionTest, PrintsMalformedBoxesAsReceived) {
  EXPECT_EQ(BoxToString(Box{{}, {1, 3}}), "start [] extent [1, 3]");
  EXPECT_EQ(BoxToString(Box{{0, 0, 0}, {1}}), "start [0, 0, 0] extent [1]");
  EXPECT_EQ(BoxToString(Box{{std::numeric_limits<int64_t>::max()}, {2}}),
            "[9223372036854775807:9223372036854775807+2]");
  EXPECT_EQ(BoxToString(Box{{0, 8}, {4, 8}}), "[0:4, 8:16]");
}

}  // namespace
}  // namespace cohort::coordinator
