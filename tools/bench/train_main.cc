// cohort-bench-train: single-process training step time of Cohort's fp32 CPU
// GPT engine (worker/model on a CpuBackend, worker/train's AdamW and
// gradient-norm clipping), the C++ half of `tools/dev bench train`
// (tools/bench/train_bench.sh runs it beside tools/bench/torch_train_bench.py).
//
//   cohort-bench-train --config tiny|gpt2-124m [--threads N] [--batch 4] [--seq 64]
//                      [--warmup 3] [--steps 10] [--op_profile]
//
// A step is what a trainer does for one micro-batch: ZeroGrad, Forward,
// Backward, the global gradient norm, clipping to 1.0 and an AdamW update of
// every parameter. It prints, for the steps after the warmup,
//
//   RESULT cohort <config> <threads> <B> <T> <step ms,...>
//   PHASES cohort <config> <median forward ms> <median backward ms> <median optimizer ms>
//
// and the losses on stderr (they must fall: a sanity check that the step
// trains). --op_profile adds the time of each kind of backend op per step.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/bench/host_optimizer.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/gpt_config.h"
#include "worker/model/gpt_model.h"

ABSL_FLAG(std::string, config, "tiny",
          "tiny (L=2, C=128, NH=4, V=512, maxT=64) or gpt2-124m (L=12, C=768, NH=12, "
          "V=50257 padded to 50304, maxT=1024)");
ABSL_FLAG(int, threads, 0,
          "OpenMP threads of the backend and optimizer; 0 = OMP_NUM_THREADS/cores");
ABSL_FLAG(int, batch, 4, "sequences per step (B)");
ABSL_FLAG(int, seq, 64, "tokens per sequence (T)");
ABSL_FLAG(int, warmup, 3, "untimed steps first");
ABSL_FLAG(int, steps, 10, "timed steps");
ABSL_FLAG(bool, op_profile, false,
          "also print the time of each kind of backend op per timed step (stderr)");

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const std::string& message) {
  std::fprintf(stderr, "cohort-bench-train: %s\n", message.c_str());
  return 1;
}

double Ms(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A Backend that forwards every op to another and adds up the wall time of
// each kind of op (--op_profile). CpuBackend ops are synchronous, so the time
// of a call is the op's time.
class TimingBackend final : public cohort::compute::Backend {
  using DType = cohort::compute::DType;
  using Buffer = cohort::compute::Buffer;
  using Span = cohort::compute::TensorSpan;

 public:
  explicit TimingBackend(cohort::compute::Backend* inner) : inner_(inner) {}

  // Milliseconds per op name since the last Reset.
  const std::map<std::string, double>& totals() const { return totals_; }
  void Reset() { totals_.clear(); }

  std::string_view name() const override { return inner_->name(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  bool host_memory() const override { return inner_->host_memory(); }
  absl::StatusOr<cohort::compute::Buffer> AllocateHost(DType dtype, size_t numel) override {
    return inner_->AllocateHost(dtype, numel);
  }
  absl::Status ReserveScratch(const cohort::compute::PassShape& shape) override {
    return inner_->ReserveScratch(shape);
  }
  absl::StatusOr<Buffer> Allocate(DType dtype, size_t numel) override {
    return inner_->Allocate(dtype, numel);
  }
  void Zero(Span dst) override {
    Time("Zero", [&] { inner_->Zero(dst); });
  }
  void CopyFromHost(Span dst, const void* src) override {
    Time("Copy", [&] { inner_->CopyFromHost(dst, src); });
  }
  void CopyToHost(void* dst, Span src) override {
    Time("Copy", [&] { inner_->CopyToHost(dst, src); });
  }
  void CopyWithin(Span dst, Span src) override {
    Time("Copy", [&] { inner_->CopyWithin(dst, src); });
  }
  void CopyFromHostAsync(Span dst, const void* src) override {
    Time("Copy", [&] { inner_->CopyFromHostAsync(dst, src); });
  }
  void CopyToHostAsync(void* dst, Span src) override {
    Time("Copy", [&] { inner_->CopyToHostAsync(dst, src); });
  }
  absl::Status AttachParams(Span params,
                            const std::vector<cohort::compute::ParamBlock>& blocks) override {
    return inner_->AttachParams(params, blocks);
  }
  void RefreshParamCopy() override {
    Time("RefreshParamCopy", [&] { inner_->RefreshParamCopy(); });
  }
  void DetachParams(Span params) override { inner_->DetachParams(params); }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  void EncoderForward(Span out, Span inp, Span wte, Span wpe, int B, int T, int C) override {
    Time("EncoderForward", [&] { inner_->EncoderForward(out, inp, wte, wpe, B, T, C); });
  }
  void EncoderBackward(Span dwte, Span dwpe, Span dout, Span inp, int B, int T, int C) override {
    Time("EncoderBackward", [&] { inner_->EncoderBackward(dwte, dwpe, dout, inp, B, T, C); });
  }
  void LayerNormForward(Span out, Span mean, Span rstd, Span inp, Span weight, Span bias, int N,
                        int C) override {
    Time("LayerNormForward",
         [&] { inner_->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C); });
  }
  void LayerNormBackward(Span dinp, Span dweight, Span dbias, Span dout, Span inp, Span weight,
                         Span mean, Span rstd, int N, int C) override {
    Time("LayerNormBackward", [&] {
      inner_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    });
  }
  void MatmulForward(Span out, Span inp, Span weight, Span bias, int N, int C, int OC) override {
    Time(absl::StrCat("MatmulForward ", C, "->", OC),
         [&] { inner_->MatmulForward(out, inp, weight, bias, N, C, OC); });
  }
  void MatmulBackward(Span dinp, Span dweight, Span dbias, Span dout, Span inp, Span weight, int N,
                      int C, int OC) override {
    Time(absl::StrCat("MatmulBackward ", C, "->", OC),
         [&] { inner_->MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC); });
  }
  void MatmulGeluForward(Span out, Span pre, Span inp, Span weight, Span bias, int N, int C,
                         int OC) override {
    Time(absl::StrCat("MatmulGeluForward ", C, "->", OC),
         [&] { inner_->MatmulGeluForward(out, pre, inp, weight, bias, N, C, OC); });
  }
  void MatmulGeluBackward(Span dpre, Span dpre_bias, Span dweight, Span dbias, Span dout, Span act,
                          Span pre, Span weight, int N, int C, int OC) override {
    Time(absl::StrCat("MatmulGeluBackward ", C, "->", OC), [&] {
      inner_->MatmulGeluBackward(dpre, dpre_bias, dweight, dbias, dout, act, pre, weight, N, C, OC);
    });
  }
  void ResidualLayerNormForward(Span residual_out, Span out, Span mean, Span rstd, Span inp1,
                                Span inp2, Span weight, Span bias, int N, int C) override {
    Time("ResidualLayerNormForward", [&] {
      inner_->ResidualLayerNormForward(residual_out, out, mean, rstd, inp1, inp2, weight, bias, N,
                                       C);
    });
  }
  size_t AttentionStateNumel(int B, int T, int C, int NH) const override {
    return inner_->AttentionStateNumel(B, T, C, NH);
  }
  void AttentionForward(Span out, Span state, Span qkv, int B, int T, int C, int NH) override {
    Time("AttentionForward", [&] { inner_->AttentionForward(out, state, qkv, B, T, C, NH); });
  }
  void AttentionBackward(Span dqkv, Span dout, Span qkv, Span state, int B, int T, int C,
                         int NH) override {
    Time("AttentionBackward",
         [&] { inner_->AttentionBackward(dqkv, dout, qkv, state, B, T, C, NH); });
  }
  void GeluForward(Span out, Span inp, size_t n) override {
    Time("GeluForward", [&] { inner_->GeluForward(out, inp, n); });
  }
  void GeluBackward(Span dinp, Span inp, Span dout, size_t n) override {
    Time("GeluBackward", [&] { inner_->GeluBackward(dinp, inp, dout, n); });
  }
  void ResidualForward(Span out, Span inp1, Span inp2, size_t n) override {
    Time("ResidualForward", [&] { inner_->ResidualForward(out, inp1, inp2, n); });
  }
  void ResidualBackward(Span dinp1, Span dinp2, Span dout, size_t n) override {
    Time("ResidualBackward", [&] { inner_->ResidualBackward(dinp1, dinp2, dout, n); });
  }
  void CrossEntropyForward(Span losses, Span lse, Span logits, Span targets, int N, int V,
                           int Vp) override {
    Time("CrossEntropyForward",
         [&] { inner_->CrossEntropyForward(losses, lse, logits, targets, N, V, Vp); });
  }
  void CrossEntropyBackward(Span dlogits, Span logits, Span lse, Span targets, Span dlosses, int N,
                            int V, int Vp) override {
    Time("CrossEntropyBackward",
         [&] { inner_->CrossEntropyBackward(dlogits, logits, lse, targets, dlosses, N, V, Vp); });
  }
  void EncoderForwardShard(Span out, Span inp, Span wte, Span wpe, int start, int Vs, int B,
                           int T, int C) override {
    Time("EncoderForwardShard",
         [&] { inner_->EncoderForwardShard(out, inp, wte, wpe, start, Vs, B, T, C); });
  }
  void EncoderBackwardShard(Span dwte, Span dwpe, Span dout, Span inp, int start, int Vs, int B,
                            int T, int C) override {
    Time("EncoderBackwardShard",
         [&] { inner_->EncoderBackwardShard(dwte, dwpe, dout, inp, start, Vs, B, T, C); });
  }
  void CrossEntropyShardMax(Span row_max, Span logits, int N, int V, int Vs, int start) override {
    Time("CrossEntropyShardMax",
         [&] { inner_->CrossEntropyShardMax(row_max, logits, N, V, Vs, start); });
  }
  void CrossEntropyShardSums(Span sums, Span logits, Span row_max, Span targets, int N, int V,
                             int Vs, int start) override {
    Time("CrossEntropyShardSums",
         [&] { inner_->CrossEntropyShardSums(sums, logits, row_max, targets, N, V, Vs, start); });
  }
  void CrossEntropyShardFinish(Span losses, Span lse, Span row_max, Span sums, int N) override {
    Time("CrossEntropyShardFinish",
         [&] { inner_->CrossEntropyShardFinish(losses, lse, row_max, sums, N); });
  }
  void CrossEntropyShardBackward(Span dlogits, Span logits, Span lse, Span targets, Span dlosses,
                                 int N, int V, int Vs, int start) override {
    Time("CrossEntropyShardBackward", [&] {
      inner_->CrossEntropyShardBackward(dlogits, logits, lse, targets, dlosses, N, V, Vs, start);
    });
  }
  void SumOfSquaresPieces(Span sums, Span grads, Span pieces) override {
    Time("SumOfSquaresPieces", [&] { inner_->SumOfSquaresPieces(sums, grads, pieces); });
  }
  void SumLosses(Span sum, Span losses) override {
    Time("SumLosses", [&] { inner_->SumLosses(sum, losses); });
  }
  void SkipUpdateUnlessFinite(Span scalars, Span values) override {
    Time("SkipUpdateUnlessFinite", [&] { inner_->SkipUpdateUnlessFinite(scalars, values); });
  }
  void FinishGradNorm(Span scalars, Span sums, double max_norm) override {
    Time("FinishGradNorm", [&] { inner_->FinishGradNorm(scalars, sums, max_norm); });
  }
  void ClipAdamW(Span params, Span m, Span v, Span grads, Span scalars, size_t begin, size_t end,
                 size_t moment_base, bool decay,
                 const cohort::compute::AdamWScalars& adamw) override {
    Time("ClipAdamW", [&] {
      inner_->ClipAdamW(params, m, v, grads, scalars, begin, end, moment_base, decay, adamw);
    });
  }

 private:
  template <typename F>
  void Time(const std::string& op, F&& f) {
    const Clock::time_point start = Clock::now();
    f();
    totals_[op] += Ms(start, Clock::now());
  }

  cohort::compute::Backend* const inner_;
  std::map<std::string, double> totals_;
};

bool ConfigByName(const std::string& name, cohort::model::GptConfig* config) {
  if (name == "tiny") {
    *config = {.layers = 2, .heads = 4, .width = 128, .vocab_size = 512, .context_length = 64};
    return true;
  }
  if (name == "gpt2-124m") {
    *config = {.layers = 12,
               .heads = 12,
               .width = 768,
               .vocab_size = 50257,
               .context_length = 1024,
               .padded_vocab = 50304};
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("cohort-bench-train --config tiny|gpt2-124m [--threads N]");
  absl::ParseCommandLine(argc, argv);
  namespace model = cohort::model;

  const std::string name = absl::GetFlag(FLAGS_config);
  model::GptConfig config;
  if (!ConfigByName(name, &config)) return Fail(absl::StrCat("unknown --config ", name));
  const int threads =
      absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : omp_get_max_threads();
  const int B = absl::GetFlag(FLAGS_batch);
  const int T = absl::GetFlag(FLAGS_seq);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_steps);
  if (B < 1 || T < 1 || T > config.context_length || warmup < 0 || steps < 1) {
    return Fail("need --batch >= 1, 1 <= --seq <= context length, --warmup >= 0, --steps >= 1");
  }

  cohort::compute::CpuBackend cpu(cohort::compute::CpuBackendOptions{.num_threads = threads});
  TimingBackend timing(&cpu);
  const bool op_profile = absl::GetFlag(FLAGS_op_profile);
  cohort::compute::Backend* backend =
      op_profile ? static_cast<cohort::compute::Backend*>(&timing) : &cpu;
  auto created =
      model::GptModel::Create(config, backend, model::ModelOptions{.max_micro_batch = B});
  if (!created.ok()) return Fail(created.status().ToString());
  model::GptModel& gpt = **created;
  gpt.InitializeParameters(/*seed=*/1234);
  const size_t n = gpt.num_params();
  cohort::bench::HostOptimizer optimizer(gpt, threads);

  // A few fixed random batches, cycled: the data does not change the work.
  constexpr int kBatches = 4;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(kBatches) * 2 * B * T);
  for (int32_t& t : tokens) t = token(rng);

  std::vector<double> step_ms, forward_ms, backward_ms, optimizer_ms, losses;
  for (int step = 0; step < warmup + steps; ++step) {
    const int32_t* inputs = tokens.data() + static_cast<size_t>(step % kBatches) * 2 * B * T;
    const Clock::time_point t0 = Clock::now();
    gpt.ZeroGrad();
    absl::StatusOr<double> loss = gpt.Forward(inputs, inputs + B * T, B, T);
    if (!loss.ok()) return Fail(loss.status().ToString());
    const Clock::time_point t1 = Clock::now();
    if (absl::Status s = gpt.Backward(1.0f); !s.ok()) return Fail(s.ToString());
    const Clock::time_point t2 = Clock::now();
    if (absl::Status s = optimizer.Step(gpt, step + 1); !s.ok()) return Fail(s.ToString());
    const Clock::time_point t3 = Clock::now();
    losses.push_back(*loss);
    if (step < warmup) {
      timing.Reset();
      continue;
    }
    step_ms.push_back(Ms(t0, t3));
    forward_ms.push_back(Ms(t0, t1));
    backward_ms.push_back(Ms(t1, t2));
    optimizer_ms.push_back(Ms(t2, t3));
  }

  std::vector<std::string> cells;
  for (double ms : step_ms) cells.push_back(absl::StrCat(ms));
  std::printf("RESULT cohort %s %d %d %d %s\n", name.c_str(), threads, B, T,
              absl::StrJoin(cells, ",").c_str());
  std::printf("PHASES cohort %s %.3f %.3f %.3f\n", name.c_str(), Median(forward_ms),
              Median(backward_ms), Median(optimizer_ms));
  if (op_profile) {
    std::vector<std::pair<double, std::string>> ops;
    for (const auto& [op, ms] : timing.totals()) ops.emplace_back(ms / steps, op);
    std::sort(ops.rbegin(), ops.rend());
    std::fprintf(stderr, "backend ops, ms per step (forward + backward: %.3f):\n",
                 Median(forward_ms) + Median(backward_ms));
    for (const auto& [ms, op] : ops) std::fprintf(stderr, "  %9.3f  %s\n", ms, op.c_str());
  }
  std::fprintf(stderr, "cohort %s: %zu parameters, loss %.4f -> %.4f, median step %.3f ms\n",
               name.c_str(), n, losses.front(), losses.back(), Median(step_ms));
  return 0;
}
