// CUDA graphs of a model's forward and backward (GptModel::TrainMicroBatch
// through compute::CaptureCache on the CUDA backend: cudaStreamBeginCapture,
// cudaGraphInstantiate, cudaGraphLaunch): replayed passes give bitwise the
// loss sum and gradients of the same passes launched op by op on a second
// backend, with new tokens and a new loss scale each pass (read at replay
// time), across two shapes; every capture succeeds (a failure here is a
// defect: some call in the pass is not capturable). Tolerance: none, bit for
// bit, since both run the same kernels and cuBLASLt algorithms. fp32 and
// bf16 (in bf16 the GEMMs read the weights' working copy, and attention is
// cuDNN's where it loads). Skips, naming the reason, without a CUDA device;
// fails so under COHORT_GPU_REQUIRED=1.

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/gpu_required.h"
#include "tests/testing/micro_batch_passes.h"
#include "worker/compute/backend_factory.h"

namespace cohort::model {
namespace {

using testing::MicroBatchPasses;

class GptCudaGraphTest : public ::testing::TestWithParam<compute::Precision> {
 protected:
  void SetUp() override {
    for (std::unique_ptr<compute::Backend>* backend : {&captured_backend_, &direct_backend_}) {
      absl::StatusOr<std::unique_ptr<compute::Backend>> created = compute::CreateBackend(
          compute::BackendOptions{.kind = compute::BackendKind::kCuda, .precision = GetParam()});
      if (!created.ok()) {
        COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no CUDA backend here: " + created.status().ToString());
      }
      *backend = *std::move(created);
    }
  }

  std::unique_ptr<compute::Backend> captured_backend_, direct_backend_;
  MicroBatchPasses captured_, direct_;  // destroyed before the backends
};

TEST_P(GptCudaGraphTest, ReplayedPassesGiveTheBitsOfLaunchedOnes) {
  // Head width 32 (cuDNN plans it in bf16); 211 tokens, padded to 256.
  const GptConfig config{
      .layers = 2, .heads = 3, .width = 96, .vocab_size = 211, .context_length = 64};
  ASSERT_TRUE(captured_.Init(captured_backend_.get(), config, 4, /*capture=*/true).ok());
  ASSERT_TRUE(direct_.Init(direct_backend_.get(), config, 4, /*capture=*/false).ok());
  ASSERT_TRUE(captured_.graphs->active());
  struct Shape {
    int B, T;
  };
  const std::vector<Shape> shapes = {{4, 64}, {4, 64}, {4, 64}, {4, 64},
                                     {2, 64}, {2, 64}, {2, 64}, {4, 64}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [B, T] = shapes[i];
    const std::vector<int32_t> ids = testing::RandomTokens(config.vocab_size, B, T, 200 + i);
    const double scale = 1.0 / (1 + i % 3);
    absl::StatusOr<double> a = captured_.Pass(ids, B, T, scale);
    absl::StatusOr<double> b = direct_.Pass(ids, B, T, scale);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_TRUE(std::isfinite(*a));
    EXPECT_EQ(std::memcmp(&*a, &*b, sizeof(double)), 0)
        << "pass " << i << " loss sum " << *a << " vs " << *b;
    const std::vector<float> ga = captured_.Grads();
    const std::vector<float> gb = direct_.Grads();
    EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)), 0)
        << "pass " << i << " gradients";
  }
  EXPECT_EQ(captured_.graphs->failed_captures(), 0u);
  EXPECT_EQ(captured_.graphs->captures(), 2u);
  EXPECT_EQ(captured_.graphs->replays(), 6u);  // 4 of (4, 64), 2 of (2, 64)
}

INSTANTIATE_TEST_SUITE_P(Precisions, GptCudaGraphTest,
                         ::testing::Values(compute::Precision::kFp32, compute::Precision::kBf16));

}  // namespace
}  // namespace cohort::model
