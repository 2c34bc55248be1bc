// GptModel: argument errors, gradient accumulation semantics, the tied
// embedding, and bitwise determinism (same run twice; 1 vs 2 threads).
// Numerical agreement with PyTorch is gpt_torch_test.cc.

#include "worker/model/gpt_model.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "common/log.h"
#include "gtest/gtest.h"
#include "worker/compute/cpu_backend.h"
#include "worker/compute/cpu_kernels.h"
#include "worker/train/adamw.h"

namespace cohort::model {
namespace {

GptConfig Tiny() {
  return GptConfig{.layers = 2, .heads = 4, .width = 32, .vocab_size = 50, .context_length = 16};
}

std::vector<int32_t> Tokens(size_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

double RelativeError(const float* a, const float* b, size_t n) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < n; ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

class GptModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto created = GptModel::Create(Tiny(), &backend_, ModelOptions{.max_micro_batch = 4});
    ASSERT_TRUE(created.ok()) << created.status();
    model_ = std::move(*created);
    model_->InitializeParameters(11);
  }

  compute::CpuBackend backend_{compute::CpuBackendOptions{.num_threads = 2}};
  std::unique_ptr<GptModel> model_;
};

TEST_F(GptModelTest, CreateRejectsBadArguments) {
  GptConfig bad = Tiny();
  bad.heads = 5;
  EXPECT_EQ(GptModel::Create(bad, &backend_, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GptModel::Create(Tiny(), nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GptModel::Create(Tiny(), &backend_, ModelOptions{.max_micro_batch = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GptModelTest, ForwardValidatesShapesAndTokens) {
  std::vector<int32_t> tokens = Tokens(5 * 16, 50, 1);
  const int32_t* x = tokens.data();
  EXPECT_EQ(model_->Forward(x, x, 5, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Forward(x, x, 0, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Forward(x, x, 2, 17).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Forward(nullptr, x, 2, 8).status().code(), absl::StatusCode::kInvalidArgument);
  tokens[9] = 50;  // == vocab_size: a padding id is not a real token
  absl::Status status = model_->Forward(x, x + 16, 2, 8).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("(b=1, t=1)"), absl::string_view::npos) << status;
  tokens[9] = -1;
  EXPECT_EQ(model_->Forward(x + 16, x, 2, 8).status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing ran: no logits, no backward.
  EXPECT_TRUE(model_->logits().empty());
  EXPECT_EQ(model_->Backward(1.0f).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(GptModelTest, InitialLossIsNearUniformAndPaddingLogitsAreZero) {
  const std::vector<int32_t> tokens = Tokens(2 * 2 * 16, 50, 2);
  absl::StatusOr<double> loss = model_->Forward(tokens.data(), tokens.data() + 32, 2, 16);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, std::log(50.0), 0.1);  // small init: nearly uniform predictions
  const int Vp = Tiny().PaddedVocab();
  ASSERT_EQ(Vp, 128);
  EXPECT_EQ(model_->last_batch(), 2);
  EXPECT_EQ(model_->last_time(), 16);
  ASSERT_EQ(model_->logits().numel, 2u * 16 * Vp);
  std::vector<float> logits(2 * 16 * Vp);
  ASSERT_TRUE(model_->CopyLogitsToHost(logits.data()).ok());
  for (int n = 0; n < 32; ++n) {
    for (int v = 50; v < Vp; ++v) ASSERT_EQ(logits[n * Vp + v], 0.0f);  // zero wte padding rows
    EXPECT_NE(logits[n * Vp], 0.0f);
  }
}

TEST_F(GptModelTest, BackwardWritesTheLogitsGradientOverTheLogits) {
  // One vocabulary-sized buffer: after a backward the logits are gone, and
  // every reader says so instead of reading gradients as logits.
  const std::vector<int32_t> tokens = Tokens(2 * 2 * 16, 50, 4);
  const int32_t* inputs = tokens.data();
  const int32_t* targets = tokens.data() + 32;
  ASSERT_TRUE(model_->Forward(inputs, targets, 2, 16).ok());
  const compute::TensorSpan logits = model_->logits();
  ASSERT_FALSE(logits.empty());
  std::vector<float> before(logits.numel);
  ASSERT_TRUE(model_->CopyLogitsToHost(before.data()).ok());
  model_->ZeroGrad();
  ASSERT_TRUE(model_->Backward(1.0).ok());
  // The buffer now holds the gradient: each row sums to ~0 over the real
  // vocabulary (softmax minus one-hot), which no row of logits here does.
  const auto* dlogits = static_cast<const float*>(logits.data);
  const int Vp = Tiny().PaddedVocab();
  double row_sum = 0.0;
  for (int v = 0; v < 50; ++v) row_sum += dlogits[v];
  EXPECT_NEAR(row_sum, 0.0, 1e-6);
  EXPECT_NE(dlogits[0], before[0]);
  EXPECT_EQ(dlogits[Vp - 1], 0.0f);  // padding columns get a zero gradient
  EXPECT_TRUE(model_->logits().empty());
  std::vector<float> after(before.size());
  const absl::Status copy = model_->CopyLogitsToHost(after.data());
  EXPECT_EQ(copy.code(), absl::StatusCode::kFailedPrecondition) << copy;
  EXPECT_NE(copy.message().find("gradient"), absl::string_view::npos) << copy;
  // A second backward would take those gradients for logits.
  const absl::Status again = model_->Backward(1.0);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  // A new forward brings the logits back, bit for bit.
  ASSERT_TRUE(model_->Forward(inputs, targets, 2, 16).ok());
  ASSERT_TRUE(model_->CopyLogitsToHost(after.data()).ok());
  EXPECT_EQ(std::memcmp(after.data(), before.data(), before.size() * sizeof(float)), 0);
  EXPECT_TRUE(model_->Backward(1.0).ok());
}

TEST_F(GptModelTest, MicroBatchAccumulationEqualsTheWholeBatch) {
  const size_t n = model_->num_params();
  const std::vector<int32_t> tokens = Tokens(2 * 4 * 12, 50, 3);
  const int32_t* inputs = tokens.data();
  const int32_t* targets = tokens.data() + 4 * 12;
  model_->ZeroGrad();
  absl::StatusOr<double> whole = model_->Forward(inputs, targets, 4, 12);
  ASSERT_TRUE(whole.ok());
  ASSERT_TRUE(model_->Backward(1.0f).ok());
  const std::vector<float> g_whole(model_->grads(), model_->grads() + n);

  model_->ZeroGrad();
  double mean = 0.0;
  for (int half = 0; half < 2; ++half) {
    absl::StatusOr<double> loss =
        model_->Forward(inputs + half * 2 * 12, targets + half * 2 * 12, 2, 12);
    ASSERT_TRUE(loss.ok());
    mean += *loss / 2;
    ASSERT_TRUE(model_->Backward(0.5f).ok());
  }
  EXPECT_NEAR(mean, *whole, 1e-6);
  EXPECT_LT(RelativeError(model_->grads(), g_whole.data(), n), 1e-6);
  // Every tensor received gradient, the unused wpe rows (t >= 12) none.
  for (const ParameterInfo& info : model_->table().tensors()) {
    double norm = 0.0;
    for (size_t i = 0; i < info.numel; ++i) norm += std::abs(model_->grads()[info.offset + i]);
    EXPECT_GT(norm, 0.0) << info.name;
  }
  const size_t wpe = model_->table()[kWpe].offset;
  for (size_t i = 12 * 32; i < 16 * 32; ++i) ASSERT_EQ(model_->grads()[wpe + i], 0.0f);
}

TEST_F(GptModelTest, BackwardAccumulatesAndScales) {
  const size_t n = model_->num_params();
  const std::vector<int32_t> tokens = Tokens(2 * 3 * 10, 50, 4);
  ASSERT_TRUE(model_->Forward(tokens.data(), tokens.data() + 30, 3, 10).ok());
  model_->ZeroGrad();
  ASSERT_TRUE(model_->Backward(1.0f).ok());
  const std::vector<float> g1(model_->grads(), model_->grads() + n);
  // The backward wrote the logits' gradient over the logits: the second
  // needs the forward again (the same activations, bit for bit).
  ASSERT_TRUE(model_->Forward(tokens.data(), tokens.data() + 30, 3, 10).ok());
  ASSERT_TRUE(model_->Backward(2.0f).ok());  // adds 2x on top: 3x in total
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = 3.0f * g1[i];
  EXPECT_LT(RelativeError(model_->grads(), want.data(), n), 1e-6);
  EXPECT_EQ(model_->Backward(NAN).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GptModelTest, TiedEmbeddingGetsLmHeadAndEncoderGradients) {
  // A token id that appears in no input still gets wte gradient from the LM
  // head (every real row feeds a logit); the padding rows get none.
  std::vector<int32_t> tokens(2 * 16, 0);
  for (int i = 0; i < 16; ++i) tokens[16 + i] = i % 7;  // targets
  ASSERT_TRUE(model_->Forward(tokens.data(), tokens.data() + 16, 1, 16).ok());
  model_->ZeroGrad();
  ASSERT_TRUE(model_->Backward(1.0f).ok());
  const float* dwte = model_->grads() + model_->table()[kWte].offset;
  const int C = 32;
  double row30 = 0.0, row0 = 0.0, pad = 0.0;
  for (int c = 0; c < C; ++c) {
    row30 += std::abs(dwte[30 * C + c]);
    row0 += std::abs(dwte[0 * C + c]);
    pad += std::abs(dwte[60 * C + c]);
  }
  EXPECT_GT(row30, 0.0);
  EXPECT_GT(row0, row30);  // token 0 is also every input: the encoder adds to it
  EXPECT_EQ(pad, 0.0);
}

// One forward + backward + AdamW step on a model big enough that every
// kernel splits work across threads; returns loss, logits, grads, params.
struct RunResult {
  double loss = 0.0;
  std::vector<float> logits, grads, params;
};

RunResult RunOnce(int threads) {
  const GptConfig config{
      .layers = 2, .heads = 4, .width = 128, .vocab_size = 500, .context_length = 64};
  compute::CpuBackend backend(compute::CpuBackendOptions{.num_threads = threads});
  // B*T*C at the threshold: every kernel loop is split across threads.
  constexpr int B = 8, T = 64;
  static_assert(int64_t{B} * T * 128 >= compute::cpu::kMinParallelWork);
  auto created = GptModel::Create(config, &backend, ModelOptions{.max_micro_batch = B});
  CHECK(created.ok()) << created.status();
  GptModel& model = **created;
  model.InitializeParameters(9);
  const std::vector<int32_t> tokens = Tokens(2 * B * T, 500, 5);
  RunResult r;
  model.ZeroGrad();
  r.loss = model.Forward(tokens.data(), tokens.data() + B * T, B, T).value();
  // Before the backward, which writes the logits' gradient over them.
  r.logits.resize(model.logits().numel);
  CHECK(model.CopyLogitsToHost(r.logits.data()).ok());
  CHECK(model.Backward(1.0f).ok());
  const size_t n = model.num_params();
  r.grads.assign(model.grads(), model.grads() + n);
  std::vector<float> m(n), v(n);
  CHECK(
      train::AdamWUpdate(train::AdamWOptions{.weight_decay = 0.1, .num_threads = threads},
                         train::AdamWSlice{model.params(), model.grads(), m.data(), v.data(), 0, n},
                         train::WeightDecayRanges(model.table(), 0, n), 1e-3, 1)
          .ok());
  r.params.assign(model.params(), model.params() + n);
  return r;
}

void ExpectBitwiseEqual(const RunResult& a, const RunResult& b, const char* what) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << what << ": loss";
  for (const auto& [x, y, name] :
       {std::tuple{&a.logits, &b.logits, "logits"}, std::tuple{&a.grads, &b.grads, "grads"},
        std::tuple{&a.params, &b.params, "params"}}) {
    ASSERT_EQ(x->size(), y->size());
    EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0)
        << what << ": " << name;
  }
}

TEST(GptModelDeterminismTest, SameRunTwiceIsBitwiseEqual) {
  ExpectBitwiseEqual(RunOnce(2), RunOnce(2), "run twice");
}

TEST(GptModelDeterminismTest, OneAndTwoThreadsAreBitwiseEqual) {
  const RunResult one = RunOnce(1);
  ExpectBitwiseEqual(one, RunOnce(2), "1 vs 2 threads");
  ExpectBitwiseEqual(one, RunOnce(3), "1 vs 3 threads");
}

}  // namespace
}  // namespace cohort::model
