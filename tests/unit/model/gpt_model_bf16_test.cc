// GptModel with bf16 activations (backend.h, "Activation storage"), on
// GuardedBackend over a bf16-mode CPU backend: the host may not touch the
// backend's memory (a host read of an activation dies with SIGSEGV), and the
// activations are bf16 as a bf16 GPU keeps them. A forward and backward
// agree with the fp32 model within what bf16's rounding allows, are bitwise
// the unstaged bf16 CPU model's and bitwise repeatable, and the tensor- and
// pipeline-parallel layouts (two ranks in one process: threads over an
// in-memory tensor group, stages handed their exchanges by the test) agree
// with the single rank within the same bound.
//
// The bound. bf16 keeps 8 significant bits, so each store rounds with a
// relative error of at most u = 2^-9. A forward stores an element on its way
// from the embedding to the loss S = 3 + 10 L times (the encoder's output;
// per layer ln1, qkv, atty, attproj, residual2, ln2, fch, fch_gelu, fcproj,
// residual3; lnf and the logits), and to first order the relative errors of
// those stores add: the logits and the loss are within S u of the fp32
// model's (relative). The backward stores about as many gradients again
// (dresidual, dln, datty, dqkv, dfch per layer, the dlogits), so every
// parameter gradient is within 2 S u of fp32's (normwise relative). For the
// tiny model (L = 2) that is 5% and 9%: loose beside what the rounding does
// on average (errors of random sign add as sqrt(S) u, a few tenths of a
// percent, which the test prints), and tight beside what a mistake does (a
// bf16 span read as fp32, a missed rounding in the wrong place, a reduction
// of the wrong dtype: errors of order one, or NaN).

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/guarded_backend.h"
#include "tests/testing/torch_reference.h"
#include "worker/comm/in_memory_communicator.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/gpt_model.h"

namespace cohort::model {
namespace {

using compute::CpuBackendOptions;
using compute::DType;

constexpr int kB = 2, kT = 16;
constexpr uint64_t kSeed = 11;
constexpr double kU = 1.0 / 512;  // 2^-9, bf16's unit roundoff

GptConfig Tiny() {
  return GptConfig{.layers = 2, .heads = 4, .width = 32, .vocab_size = 50, .context_length = 16};
}

// S: the stores on an element's way from the embedding to the loss.
double ForwardStores(const GptConfig& config) { return 3.0 + 10.0 * config.layers; }

CpuBackendOptions Bf16(int threads = 1) {
  return CpuBackendOptions{.num_threads = threads, .activation_dtype = DType::kBFloat16};
}

std::vector<int32_t> Tokens(size_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// One forward and backward: the loss, the logits (B,T,Vp) and the gradients
// in the whole model's layout (wte's two tied parts added).
struct Pass {
  double loss = 0.0;
  std::vector<float> logits;
  std::vector<float> grads;
};

const std::vector<int32_t>& TheTokens() {
  static const std::vector<int32_t> tokens = Tokens(2 * kB * kT, Tiny().vocab_size, 5);
  return tokens;
}
const int32_t* Inputs() { return TheTokens().data(); }
const int32_t* Targets() { return TheTokens().data() + kB * kT; }

Pass WholeModel(compute::Backend& backend) {
  absl::StatusOr<std::unique_ptr<GptModel>> created =
      GptModel::Create(Tiny(), &backend, ModelOptions{.max_micro_batch = kB});
  CHECK(created.ok()) << created.status();
  GptModel& model = **created;
  model.InitializeParameters(kSeed);
  model.ZeroGrad();
  Pass pass;
  pass.loss = model.Forward(Inputs(), Targets(), kB, kT).value();
  pass.logits.resize(model.logits().numel);
  CHECK(model.CopyLogitsToHost(pass.logits.data()).ok());
  CHECK(model.Backward(1.0).ok());
  const float* grads = std::as_const(model).grads();
  pass.grads.assign(grads, grads + model.num_params());
  return pass;
}

// Writes `model`'s shard of every gradient into `global` (the whole model's
// layout); wte is the caller's when `skip_wte` (a pipeline's tied parts live
// on two stages).
void GatherGrads(const GptModel& model, std::vector<float>& global, bool skip_wte = false) {
  const ParameterTable whole(Tiny());
  const float* grads = model.grads();
  for (const ParameterInfo& info : model.table().tensors()) {
    if (!info.present() || (skip_wte && info.id == kWte)) continue;
    InsertShard(info, grads + info.offset, global.data() + whole[info.id].offset);
  }
}

// `got` within the bound of `want`: the loss within S u (relative), the
// logits within S u and each gradient tensor within 2 S u (normwise).
void ExpectWithinBf16Bound(const Pass& got, const Pass& want, const char* what) {
  const double s = ForwardStores(Tiny());
  const double loss_error = std::abs(got.loss - want.loss) / std::abs(want.loss);
  EXPECT_LE(loss_error, s * kU) << what << ": loss " << got.loss << " vs " << want.loss;
  ASSERT_EQ(got.logits.size(), want.logits.size());
  const double logits_error =
      testing::RelativeError(got.logits.data(), want.logits.data(), want.logits.size());
  EXPECT_LE(logits_error, s * kU) << what << ": logits";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  double worst = 0.0;
  const ParameterTable table(Tiny());
  for (const ParameterInfo& info : table.tensors()) {
    const double error = testing::RelativeError(got.grads.data() + info.offset,
                                                want.grads.data() + info.offset, info.numel);
    EXPECT_LE(error, 2 * s * kU) << what << ": gradient of " << info.name;
    worst = std::max(worst, error);
  }
  LOG(INFO) << what << ": loss error " << loss_error << ", logits " << logits_error
            << ", worst gradient " << worst << " (bounds " << s * kU << ", " << 2 * s * kU << ")";
}

bool SameBits(const Pass& a, const Pass& b) {
  return std::memcmp(&a.loss, &b.loss, sizeof(double)) == 0 && a.logits == b.logits &&
         a.grads.size() == b.grads.size() &&
         std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)) == 0;
}

TEST(GptModelBf16Test, AGuardedBf16PassIsWithinBf16sRoundingOfFp32) {
  compute::CpuBackend fp32_backend(CpuBackendOptions{.num_threads = 1});
  testing::GuardedBackend guarded(Bf16());
  ASSERT_EQ(guarded.activation_dtype(), DType::kBFloat16);
  const Pass fp32 = WholeModel(fp32_backend);
  const Pass bf16 = WholeModel(guarded);
  ExpectWithinBf16Bound(bf16, fp32, "bf16 vs fp32");
  // It did round: bf16 is not fp32 under another name.
  EXPECT_NE(bf16.loss, fp32.loss);
  EXPECT_NE(bf16.grads, fp32.grads);
}

TEST(GptModelBf16Test, AGuardedBf16PassIsBitwiseTheHostBf16ModelsAndRepeatable) {
  // The staged path (host copies, no host access to the backend) computes
  // what the model on host memory computes, bit for bit, run after run and
  // at any thread count.
  compute::CpuBackend host(Bf16(2));
  testing::GuardedBackend guarded(Bf16(1)), again(Bf16(3));
  const Pass direct = WholeModel(host);
  EXPECT_TRUE(SameBits(WholeModel(guarded), direct));
  EXPECT_TRUE(SameBits(WholeModel(again), direct));
  EXPECT_TRUE(SameBits(WholeModel(guarded), direct)) << "a second run on the same backend";
}

TEST(GptModelBf16Test, TensorParallelRanksAgreeWithOneRankWithinTheBound) {
  testing::GuardedBackend single_backend(Bf16());
  const Pass single = WholeModel(single_backend);
  constexpr int tp = 2;
  comm::InMemoryFabric fabric(tp);
  std::vector<double> losses(tp);
  std::vector<std::vector<float>> logits(tp);
  Pass gathered;
  gathered.grads.assign(single.grads.size(), 0.0f);
  std::vector<absl::Status> statuses(tp);
  std::vector<std::unique_ptr<testing::GuardedBackend>> backends;
  std::vector<std::unique_ptr<GptModel>> models(tp);
  for (int r = 0; r < tp; ++r)
    backends.push_back(std::make_unique<testing::GuardedBackend>(Bf16()));
  std::vector<std::unique_ptr<comm::InMemoryCommunicator>> groups;
  for (int r = 0; r < tp; ++r) {
    groups.push_back(std::make_unique<comm::InMemoryCommunicator>(&fabric, r));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] = [&]() -> absl::Status {
        ModelOptions options{.max_micro_batch = kB,
                             .layout = {.tp = tp, .tp_rank = r},
                             .tensor_group = groups[r].get(),
                             .collective_timeout = absl::Seconds(30)};
        ASSIGN_OR_RETURN(models[r], GptModel::Create(Tiny(), backends[r].get(), options));
        GptModel& model = *models[r];
        model.InitializeParameters(kSeed);
        model.ZeroGrad();
        ASSIGN_OR_RETURN(losses[r], model.Forward(Inputs(), Targets(), kB, kT));
        logits[r].resize(model.logits().numel);
        RETURN_IF_ERROR(model.CopyLogitsToHost(logits[r].data()));
        return model.Backward(1.0);
      }();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < tp; ++r) ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  EXPECT_EQ(losses[0], losses[1]) << "the ranks reduce to one loss";
  gathered.loss = losses[0];
  // Rank r holds logit columns [r Vp/2, (r+1) Vp/2) of every position.
  const int Vp = Tiny().PaddedVocab();
  const int Vs = Vp / tp;
  gathered.logits.resize(single.logits.size());
  for (int r = 0; r < tp; ++r) {
    ASSERT_EQ(logits[r].size(), static_cast<size_t>(kB * kT * Vs));
    for (int n = 0; n < kB * kT; ++n) {
      std::memcpy(&gathered.logits[static_cast<size_t>(n) * Vp + r * Vs],
                  &logits[r][static_cast<size_t>(n) * Vs], Vs * sizeof(float));
    }
    GatherGrads(*models[r], gathered.grads);
  }
  ExpectWithinBf16Bound(gathered, single, "tp 2 vs one rank");
  models.clear();
}

TEST(GptModelBf16Test, PipelineStagesAgreeWithOneRankWithinTheBound) {
  // Two stages of a staged (guarded) model: the test moves the bf16
  // exchanges between them as StepRunner does, span.bytes() at a time.
  testing::GuardedBackend single_backend(Bf16());
  const Pass single = WholeModel(single_backend);
  testing::GuardedBackend first_backend(Bf16()), last_backend(Bf16());
  auto first = GptModel::Create(
      Tiny(), &first_backend, ModelOptions{.max_micro_batch = kB, .layout = {.pp = 2, .stage = 0}});
  auto last = GptModel::Create(
      Tiny(), &last_backend, ModelOptions{.max_micro_batch = kB, .layout = {.pp = 2, .stage = 1}});
  ASSERT_TRUE(first.ok() && last.ok()) << first.status() << " " << last.status();
  GptModel& a = **first;
  GptModel& b = **last;
  a.InitializeParameters(kSeed);
  b.InitializeParameters(kSeed);
  a.ZeroGrad();
  b.ZeroGrad();
  ASSERT_TRUE(a.ForwardStage(0, Inputs(), nullptr, kB, kT).ok());
  const compute::TensorSpan output = a.StageOutput(0);
  const compute::TensorSpan input = b.StageInput(0, kB, kT);
  ASSERT_EQ(output.dtype, DType::kBFloat16);
  ASSERT_EQ(input.dtype, DType::kBFloat16);
  ASSERT_EQ(input.bytes(), output.bytes());
  ASSERT_EQ(input.bytes(), static_cast<size_t>(kB * kT * Tiny().width) * 2);
  std::memcpy(input.data, output.data, output.bytes());
  Pass staged;
  absl::StatusOr<double> loss = b.ForwardStage(0, nullptr, Targets(), kB, kT);
  ASSERT_TRUE(loss.ok()) << loss.status();
  staged.loss = *loss;
  staged.logits.resize(b.logits().numel);
  ASSERT_TRUE(b.CopyLogitsToHost(staged.logits.data()).ok());
  ASSERT_TRUE(b.BackwardStage(0, 1.0).ok());
  const compute::TensorSpan input_grad = b.StageInputGrad();
  const compute::TensorSpan output_grad = a.StageOutputGrad(kB, kT);
  ASSERT_EQ(input_grad.dtype, DType::kBFloat16);
  ASSERT_EQ(output_grad.bytes(), input_grad.bytes());
  std::memcpy(output_grad.data, input_grad.data, input_grad.bytes());
  ASSERT_TRUE(a.BackwardStage(0, 1.0).ok());
  staged.grads.assign(single.grads.size(), 0.0f);
  GatherGrads(a, staged.grads, /*skip_wte=*/true);
  GatherGrads(b, staged.grads, /*skip_wte=*/true);
  // wte: the head's part (last stage) plus the embedding's (first stage),
  // in the single model's order.
  const ParameterInfo& wte = ParameterTable(Tiny())[kWte];
  const float* head = std::as_const(b).grads() + b.table()[kWte].offset;
  const auto* embedding = static_cast<const float*>(a.embedding_grad().data);
  for (size_t i = 0; i < wte.numel; ++i) staged.grads[wte.offset + i] = head[i] + embedding[i];
  ExpectWithinBf16Bound(staged, single, "pp 2 vs one rank");
}

}  // namespace
}  // namespace cohort::model
