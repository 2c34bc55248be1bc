// GptModel::TrainMicroBatch's captured passes (compute::CaptureCache) on
// GuardedBackend, which records a capture and replays it on the memory's
// contents at replay time, as a CUDA graph does: per (B, T) a first pass
// runs directly, the second is captured and replayed, later ones replay;
// changing B or T captures the new shape (the old capture kept); a working
// copy attached again makes the captures stale (a GPU's GEMMs would read
// freed memory), so the passes warm up and capture again. Every pass gives
// bitwise the loss sum and gradients of the same pass issued directly on a
// second model, with new tokens and a new loss scale each time (both must
// be read at replay time).

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/guarded_backend.h"
#include "tests/testing/micro_batch_passes.h"

namespace cohort::model {
namespace {

using testing::MicroBatchPasses;

const GptConfig kConfig{
    .layers = 2, .heads = 4, .width = 32, .vocab_size = 53, .context_length = 16};

struct Shape {
  int B, T;
};

class GptModelCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(captured_.Init(&captured_backend_, kConfig, 2, /*capture=*/true).ok());
    ASSERT_TRUE(direct_.Init(&direct_backend_, kConfig, 2, /*capture=*/false).ok());
  }
  // Runs `shape` on both models with fresh tokens and scale; same bits.
  void ExpectSamePass(Shape shape) {
    const std::vector<int32_t> ids =
        testing::RandomTokens(kConfig.vocab_size, shape.B, shape.T, 100 + passes_);
    const double scale = 1.0 / (1 + passes_ % 3);
    ++passes_;
    absl::StatusOr<double> a = captured_.Pass(ids, shape.B, shape.T, scale);
    absl::StatusOr<double> b = direct_.Pass(ids, shape.B, shape.T, scale);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_EQ(std::memcmp(&*a, &*b, sizeof(double)), 0)
        << "pass " << passes_ << " loss sum " << *a << " vs " << *b;
    const std::vector<float> ga = captured_.Grads();
    const std::vector<float> gb = direct_.Grads();
    EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)), 0)
        << "pass " << passes_ << " gradients";
  }

  // Declared before the models, so destroyed after their buffers.
  testing::GuardedBackend captured_backend_, direct_backend_;
  MicroBatchPasses captured_, direct_;
  int passes_ = 0;
};

TEST_F(GptModelCaptureTest, EachShapeWarmsUpCapturesAndReplaysWithTheDirectBits) {
  for (Shape shape : {Shape{2, 16}, Shape{2, 16}, Shape{2, 16}}) ExpectSamePass(shape);
  EXPECT_EQ(captured_.graphs->captures(), 1u);
  EXPECT_EQ(captured_.graphs->replays(), 2u);  // the capture's own run, then one more
  // Another B, then another T: each captured anew at its second pass.
  for (Shape shape : {Shape{1, 16}, Shape{1, 16}, Shape{1, 16}, Shape{2, 8}, Shape{2, 8}}) {
    ExpectSamePass(shape);
  }
  EXPECT_EQ(captured_.graphs->captures(), 3u);
  EXPECT_EQ(captured_.graphs->replays(), 5u);
  // The first shape's capture is still good: replayed, not captured again.
  ExpectSamePass(Shape{2, 16});
  EXPECT_EQ(captured_.graphs->captures(), 3u);
  EXPECT_EQ(captured_.graphs->replays(), 6u);
  EXPECT_EQ(direct_backend_.captures(), 0u);
  EXPECT_EQ(captured_.graphs->failed_captures(), 0u);
}

TEST_F(GptModelCaptureTest, AWeightCopyAttachedAgainMakesTheCapturesStale) {
  for (int i = 0; i < 3; ++i) ExpectSamePass(Shape{2, 16});
  ASSERT_EQ(captured_.graphs->replays(), 2u);
  // A re-attach (a runner built again on this model) moves a GPU's working
  // copy: the next pass may not replay; it warms up, then captures again.
  ASSERT_TRUE(captured_.model->AttachWeightCopy().ok());
  ASSERT_TRUE(direct_.model->AttachWeightCopy().ok());
  ExpectSamePass(Shape{2, 16});
  EXPECT_EQ(captured_.graphs->replays(), 2u);
  ExpectSamePass(Shape{2, 16});
  EXPECT_EQ(captured_.graphs->captures(), 2u);
  EXPECT_EQ(captured_.graphs->replays(), 3u);
}

TEST_F(GptModelCaptureTest, WeightsWrittenFromTheHostAreReadByTheNextReplay) {
  for (int i = 0; i < 3; ++i) ExpectSamePass(Shape{2, 16});
  for (MicroBatchPasses* passes : {&captured_, &direct_}) {
    float* params = passes->model->params();  // a restore's write
    for (size_t i = 0; i < passes->model->num_params(); i += 5) params[i] *= -0.5f;
  }
  const size_t replays = captured_.graphs->replays();
  ExpectSamePass(Shape{2, 16});
  EXPECT_EQ(captured_.graphs->replays(), replays + 1);
}

}  // namespace
}  // namespace cohort::model
