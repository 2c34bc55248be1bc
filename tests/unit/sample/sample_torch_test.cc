// cohort-sample's greedy generation against PyTorch
// (tests/reference/sample_reference.py, the model of gpt_reference.py) on
// the same weights: the generated ids must be identical, and the first
// step's last-position logits within a relative Frobenius error of 1e-5.
// The prompt plus the generation is longer than the context, so the
// cropping to the newest context_length tokens is compared too.
//
// Needs python3 with torch (Debian's python3-torch). Without it the test
// fails, telling how to install it: a silently skipped comparison would hide
// regressions.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/paths.h"
#include "tests/testing/torch_reference.h"
#include "tools/sample/sampler.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/gpt_model.h"
#include "worker/model/parameter_init.h"

namespace cohort::sample {
namespace {

constexpr double kTolerance = 1e-5;
// Greedy ids can only be compared where the best logit leads the second by
// far more than the two implementations differ: this many times the largest
// difference of step 0's logits.
constexpr double kGapMargin = 10.0;
constexpr int kTokens = 40, kThreads = 2;
// Weight matrices this many times GPT-2's initial scale (see PerturbParameters).
constexpr float kMatrixScale = 10.0f;

// Biases and LayerNorms away from their constant initialisation, so that
// mixing them up would change the logits; and the blocks' matrices far
// larger than GPT-2's initial ones, so that attention and MLP outweigh the
// tied embedding on the residual path and the greedy sequence wanders (at
// initialisation each token predicts itself and one id repeats, which would
// compare little).
void PerturbParameters(const model::ParameterTable& table, float* params) {
  model::NormalRng rng(11);
  for (const model::ParameterInfo& info : table.tensors()) {
    if (info.id == model::kQkvw || info.id == model::kAttprojw || info.id == model::kFcw ||
        info.id == model::kFcprojw) {
      for (size_t i = 0; i < info.numel; ++i) params[info.offset + i] *= kMatrixScale;
    }
    if (info.weight_decay) continue;
    for (size_t i = 0; i < info.numel; ++i) {
      params[info.offset + i] += static_cast<float>(0.1 * rng.Next());
    }
  }
}

TEST(SampleTorchTest, GreedyGenerationMatchesPyTorch) {
  // vocab 100 pads to 128: the padding columns must not be chosen.
  const model::GptConfig config{
      .layers = 2, .heads = 4, .width = 64, .vocab_size = 100, .context_length = 16};
  compute::CpuBackend backend(compute::CpuBackendOptions{.num_threads = kThreads});
  absl::StatusOr<std::unique_ptr<model::GptModel>> created =
      model::GptModel::Create(config, &backend, model::ModelOptions{});
  ASSERT_TRUE(created.ok()) << created.status();
  model::GptModel& model = **created;
  model.InitializeParameters(5);
  PerturbParameters(model.table(), model.params());
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35, 89};
  ASSERT_GT(prompt.size() + kTokens, static_cast<size_t>(config.context_length));
  const int Vp = config.PaddedVocab();

  const std::string dir = testing::MakeTempDir("sample_torch");
  {
    std::ofstream cfg(dir + "/config.txt");
    cfg << "layers " << config.layers << "\nheads " << config.heads << "\nwidth " << config.width
        << "\nvocab_size " << config.vocab_size << "\ncontext_length " << config.context_length
        << "\npadded_vocab " << Vp << "\ntokens " << kTokens << "\n";
    ASSERT_TRUE(cfg.good());
  }
  testing::WriteBinaryFile(dir + "/params.bin",
                           std::vector<float>(model.params(), model.params() + model.num_params()));
  testing::WriteBinaryFile(dir + "/prompt.bin", prompt);
  const absl::Status reference = testing::RunTorchReference("sample_reference.py", dir);
  ASSERT_TRUE(reference.ok()) << reference.message();
  const auto ref_tokens = testing::ReadBinaryFile<int32_t>(dir + "/ref_tokens.bin", kTokens);
  const auto ref_logits = testing::ReadBinaryFile<float>(dir + "/ref_logits.bin", Vp);
  const auto ref_gaps = testing::ReadBinaryFile<double>(dir + "/ref_gaps.bin", kTokens);
  const double smallest_gap = *std::min_element(ref_gaps.begin(), ref_gaps.end());

  // Step 0's logits: the prompt's forward pass, last position, all Vp.
  const std::vector<int32_t> targets(prompt.size(), 0);
  ASSERT_TRUE(
      model.Forward(prompt.data(), targets.data(), 1, static_cast<int>(prompt.size())).ok());
  std::vector<float> logits(model.logits().numel);
  ASSERT_TRUE(model.CopyLogitsToHost(logits.data()).ok());
  const float* last = logits.data() + (prompt.size() - 1) * Vp;
  double diff = 0.0, norm = 0.0, max_abs = 0.0;
  for (int v = 0; v < Vp; ++v) {
    const double d = static_cast<double>(last[v]) - ref_logits[v];
    diff += d * d;
    norm += static_cast<double>(ref_logits[v]) * ref_logits[v];
    max_abs = std::max(max_abs, std::abs(d));
  }
  const double logits_error = std::sqrt(diff / norm);
  EXPECT_LE(logits_error, kTolerance) << "step 0 logits";
  ASSERT_GT(smallest_gap, kGapMargin * max_abs)
      << "a near tie makes the comparison depend on rounding; change the weights' seed";
  // The comparison must cover a sequence that changes, not one id repeated.
  ASSERT_GE(std::set<int32_t>(ref_tokens.begin(), ref_tokens.end()).size(), 5u);

  absl::StatusOr<std::vector<int32_t>> generated =
      Generate(model, prompt, SampleOptions{.tokens = kTokens, .temperature = 0});
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_EQ(*generated, ref_tokens);
  std::printf(
      "step 0 logits relative error %.3g (largest difference %.3g); smallest top-2 gap "
      "%.3g; generated",
      logits_error, max_abs, smallest_gap);
  for (int32_t id : ref_tokens) std::printf(" %d", id);
  std::printf("\n");
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cohort::sample
