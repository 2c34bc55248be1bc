// The bf16 working copy of the weights (backend.h, AttachParams) on a CUDA
// device: a model whose GEMMs read the copy, kept by the fused ClipAdamW,
// gives the very bits of the same model whose GEMMs round the fp32 weights
// per call (the same values rounded the same way, into the same padded
// layout, so cuBLASLt picks the same algorithm) over several device-resident
// steps; and a write of the weights from the host (a restore) reaches the
// copy before the next step. Tolerance: none, bit for bit. A width that is
// not a multiple of 8 (padded rows) and one that is. Skips, naming the
// reason, without a CUDA device; fails so under COHORT_GPU_REQUIRED=1.

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/gpu_required.h"
#include "worker/compute/backend_factory.h"
#include "worker/model/gpt_model.h"
#include "worker/train/device_optimizer.h"
#include "worker/train/grad_norm_plan.h"

namespace cohort::model {
namespace {

constexpr int kBatch = 2;
constexpr int kSeq = 24;
constexpr int kSteps = 4;

// A model on a bf16 CUDA backend that trains on the device (the
// device-resident step's loop without the session around it).
struct DeviceTrainer {
  std::unique_ptr<compute::Backend> backend;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<train::GradNormPlan> plan;
  std::unique_ptr<train::DeviceOptimizer> optimizer;

  absl::Status Init(const GptConfig& config, bool working_copy) {
    ASSIGN_OR_RETURN(
        backend, compute::CreateBackend(compute::BackendOptions{
                     .kind = compute::BackendKind::kCuda, .precision = compute::Precision::kBf16}));
    ASSIGN_OR_RETURN(
        model, GptModel::Create(config, backend.get(), ModelOptions{.max_micro_batch = kBatch}));
    model->InitializeParameters(11);
    plan = std::make_unique<train::GradNormPlan>(config, model->table());
    ASSIGN_OR_RETURN(optimizer, train::DeviceOptimizer::Create(
                                    backend.get(), *plan, model->table(), 0, model->num_params(),
                                    {.adamw = {.weight_decay = 0.1}, .grad_clip = 1.0}));
    optimizer->ResetMoments();
    model->set_gradients_stay_on_backend(true);
    if (working_copy) RETURN_IF_ERROR(model->AttachWeightCopy());
    return absl::OkStatus();
  }

  // One step: forward, backward, the fused clip + AdamW. The loss and norm.
  absl::StatusOr<std::pair<double, double>> Step(const std::vector<int32_t>& tokens, int step) {
    model->ZeroGrad();
    ASSIGN_OR_RETURN(double loss,
                     model->Forward(tokens.data(), tokens.data() + kBatch * kSeq, kBatch, kSeq));
    RETURN_IF_ERROR(model->Backward(1.0));
    RETURN_IF_ERROR(optimizer->Enqueue(model->params_span(), model->grads_span(), 1e-3, step + 1));
    ASSIGN_OR_RETURN(double norm, optimizer->Norm());
    model->MarkParamsChangedOnBackend();
    return std::make_pair(loss, norm);
  }
};

std::vector<int32_t> Tokens(int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tokens(2 * kBatch * kSeq);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  return tokens;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

class GptWeightCopyCudaTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<compute::Backend>> probe =
        compute::CreateBackend(compute::BackendOptions{.kind = compute::BackendKind::kCuda,
                                                       .precision = compute::Precision::kBf16});
    if (!probe.ok()) {
      COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no bf16 CUDA backend here: " + probe.status().ToString());
    }
  }
};

TEST_P(GptWeightCopyCudaTest, StepsGiveTheBitsOfPerCallRounding) {
  const GptConfig config{
      .layers = 2, .heads = 3, .width = GetParam(), .vocab_size = 211, .context_length = 32};
  DeviceTrainer copied, rounded;
  ASSERT_TRUE(copied.Init(config, /*working_copy=*/true).ok());
  ASSERT_TRUE(rounded.Init(config, /*working_copy=*/false).ok());
  for (int step = 0; step < kSteps; ++step) {
    if (step == 2) {
      // A restore: new weights from the host, uploaded (and, on the copied
      // side, rounded into the copy) by the next Forward.
      for (DeviceTrainer* trainer : {&copied, &rounded}) {
        float* params = trainer->model->params();
        for (size_t i = 0; i < trainer->model->num_params(); i += 3) params[i] *= 0.5f;
      }
    }
    const std::vector<int32_t> tokens = Tokens(config.vocab_size, 100 + step);
    absl::StatusOr<std::pair<double, double>> a = copied.Step(tokens, step);
    absl::StatusOr<std::pair<double, double>> b = rounded.Step(tokens, step);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_TRUE(SameBits(a->first, b->first))
        << "step " << step << " loss " << a->first << " vs " << b->first;
    EXPECT_TRUE(SameBits(a->second, b->second))
        << "step " << step << " norm " << a->second << " vs " << b->second;
    EXPECT_TRUE(std::isfinite(a->first));
  }
  const size_t n = copied.model->num_params();
  const GptModel& a = *copied.model;
  const GptModel& b = *rounded.model;
  EXPECT_EQ(std::memcmp(a.params(), b.params(), n * sizeof(float)), 0) << "final weights";
}

// 75 channels: rows padded from 75 to 80 in the copy (and in the per-call
// rounding); 96: no padding.
INSTANTIATE_TEST_SUITE_P(Widths, GptWeightCopyCudaTest, ::testing::Values(75, 96));

}  // namespace
}  // namespace cohort::model
