// Host staging, the path a GPU job's weights and gradients take (gpt_model.h,
// "Memory"), run on GuardedBackend: the CPU's arithmetic behind memory the
// host may not touch, so any host access to backend memory crashes the test
// where a GPU would read garbage. A model and a whole training session give
// bitwise the results of the unstaged CPU ones. Catches a missed upload (a
// step computed with stale weights), a missed download (the optimizer fed
// stale or zero gradients), a lost host write, and backend memory handed to
// host code.

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/guarded_backend.h"
#include "tests/testing/training_configs.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/gpt_model.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

std::vector<int32_t> Tokens(size_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

TEST(HostStagingTest, AStagedModelMovesWeightsAndGradientsWhenItMust) {
  const model::GptConfig config{
      .layers = 2, .heads = 2, .width = 32, .vocab_size = 40, .context_length = 12};
  constexpr int B = 2, T = 12;
  compute::CpuBackend backend(compute::CpuBackendOptions{.num_threads = 1});
  testing::GuardedBackend guarded;
  auto direct =
      model::GptModel::Create(config, &backend, model::ModelOptions{.max_micro_batch = B});
  auto staged =
      model::GptModel::Create(config, &guarded, model::ModelOptions{.max_micro_batch = B});
  ASSERT_TRUE(direct.ok() && staged.ok());
  model::GptModel& d = **direct;
  model::GptModel& s = **staged;
  EXPECT_FALSE(d.staged());
  ASSERT_TRUE(s.staged());
  d.InitializeParameters(3);
  s.InitializeParameters(3);
  const size_t n = d.num_params();
  const std::vector<int32_t> tokens = Tokens(2 * B * T, config.vocab_size, 1);
  auto pass = [&](model::GptModel& m) {
    absl::StatusOr<double> loss = m.Forward(tokens.data(), tokens.data() + B * T, B, T);
    EXPECT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(m.Backward(0.5).ok());
    return loss.value_or(0.0);
  };
  // 1. The first pass uploads the initial weights; the gradients come back.
  d.ZeroGrad();
  s.ZeroGrad();
  EXPECT_EQ(pass(d), pass(s));
  EXPECT_TRUE(SameBits(std::as_const(d).grads(), std::as_const(s).grads(), n));
  // 2. A write through params() reaches the next pass.
  d.params()[5] += 0.25f;
  s.params()[5] += 0.25f;
  d.ZeroGrad();
  s.ZeroGrad();
  EXPECT_EQ(pass(d), pass(s));
  EXPECT_TRUE(SameBits(std::as_const(d).grads(), std::as_const(s).grads(), n));
  // 3. Without ZeroGrad a backward accumulates onto what the host wrote.
  d.grads()[7] = 3.0f;
  s.grads()[7] = 3.0f;
  EXPECT_EQ(pass(d), pass(s));
  EXPECT_TRUE(SameBits(std::as_const(d).grads(), std::as_const(s).grads(), n));
  // 4. After ZeroGrad the host copies read as zeros, the embedding part too.
  // (A backward writes the logits' gradient over the logits: a forward first.)
  ASSERT_TRUE(s.ForwardStage(0, tokens.data(), tokens.data() + B * T, B, T).ok());
  ASSERT_TRUE(s.BackwardStage(0, 1.0).ok());  // leaves the embedding part nonzero
  const compute::TensorSpan embedding = s.embedding_grad();
  ASSERT_FALSE(embedding.empty());
  auto all_zero = [](const float* x, size_t count) {
    return std::all_of(x, x + count, [](float g) { return g == 0.0f; });
  };
  EXPECT_FALSE(all_zero(static_cast<const float*>(embedding.data), embedding.numel));
  s.ZeroGrad();
  EXPECT_TRUE(all_zero(std::as_const(s).grads(), n));
  EXPECT_TRUE(all_zero(static_cast<const float*>(s.embedding_grad().data), embedding.numel));
}

// The guard itself: backend memory read by the host, and host memory handed
// to an op or as the backend side of a copy, each fail where they happen.
TEST(HostStagingDeathTest, GuardedBackendCatchesMemoryOfTheWrongSide) {
  testing::GuardedBackend guarded;
  absl::StatusOr<compute::Buffer> buffer = guarded.Allocate(compute::DType::kFloat32, 64);
  ASSERT_TRUE(buffer.ok());
  std::vector<float> host(64, 1.0f);
  const compute::TensorSpan host_span{host.data(), compute::DType::kFloat32, host.size()};
  const float* device = static_cast<const float*>(buffer->data());
  EXPECT_DEATH(
      {
        volatile float x = device[3];
        (void)x;
      },
      "");
  EXPECT_DEATH(guarded.GeluForward(buffer->span(), host_span, 64), "not this backend's memory");
  EXPECT_DEATH(guarded.CopyFromHost(host_span, host.data()), "not this backend's memory");
  EXPECT_DEATH(guarded.CopyToHost(buffer->data(), buffer->span()),
               "the destination is backend memory");
  // The right sides work.
  guarded.CopyFromHost(buffer->span(), host.data());
  guarded.GeluForward(buffer->span(), buffer->span(), 64);
  std::vector<float> back(64);
  guarded.CopyToHost(back.data(), buffer->span());
  EXPECT_NE(back, host);  // gelu(1) != 1
}

TEST(HostStagingTest, AStagedSessionTrainsBitwiseLikeAnUnstagedOne) {
  // Three micro-batches per step (each backward downloads; the tree folds
  // them on the host), ZeRO-1 off and on. Keeping the previous version (as
  // a job with peers to recover does) holds a single rank on the host-staged
  // path; without it, it runs the device-resident step
  // (device_resident_step_test.cc).
  for (bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "zero1" : "no zero1");
    TrainingConfig config = testing::SmallTrainingConfig(6, 2, 5);
    config.zero1 = zero1;
    config.grad_clip = 1.0;
    std::vector<std::unique_ptr<TrainingSession>> sessions;
    for (bool staged : {false, true}) {
      TrainingSessionOptions options;
      options.num_threads = 1;
      options.state_versions.keep_previous = true;
      if (staged) options.backend = std::make_shared<testing::GuardedBackend>();
      absl::StatusOr<std::unique_ptr<TrainingSession>> session =
          TrainingSession::Create(config, model::ModelLayout{}, {}, options);
      ASSERT_TRUE(session.ok()) << session.status();
      sessions.push_back(*std::move(session));
    }
    ASSERT_TRUE(sessions[1]->model().staged());
    ASSERT_FALSE(sessions[1]->runner().device_resident());
    for (int64_t step = 0; step < config.steps; ++step) {
      absl::StatusOr<StepResult> a = sessions[0]->RunStep(Step(step));
      absl::StatusOr<StepResult> b = sessions[1]->RunStep(Step(step));
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
      EXPECT_EQ(std::memcmp(&a->loss, &b->loss, sizeof(double)), 0) << "step " << step;
      EXPECT_EQ(std::memcmp(&a->grad_norm, &b->grad_norm, sizeof(double)), 0) << "step " << step;
    }
    const model::GptModel& a = std::as_const(*sessions[0]).model();
    const model::GptModel& b = std::as_const(*sessions[1]).model();
    EXPECT_TRUE(SameBits(a.params(), b.params(), a.num_params())) << "final weights";
  }
}

}  // namespace
}  // namespace cohort::train
