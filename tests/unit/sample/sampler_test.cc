// PickToken (greedy, top-k, temperature sampling against the softmax it
// draws from) and Generate (context cropping, the real vocabulary only,
// determinism, errors) of tools/sample/sampler.h.

#include "tools/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/gpt_model.h"
#include "worker/model/parameter_init.h"

namespace cohort::sample {
namespace {

std::vector<float> RandomLogits(size_t n, uint64_t seed, double scale = 2.0) {
  model::NormalRng rng(seed);
  std::vector<float> logits(n);
  for (float& l : logits) l = static_cast<float>(scale * rng.Next());
  return logits;
}

// softmax(logits / temperature) over the top_k largest (0: all), in double.
std::vector<double> Probabilities(const std::vector<float>& logits, double temperature, int top_k) {
  std::vector<float> sorted = logits;
  std::sort(sorted.rbegin(), sorted.rend());
  const float threshold = top_k == 0 ? sorted.back() : sorted[top_k - 1];
  std::vector<double> p(logits.size(), 0.0);
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] >= threshold) p[i] = std::exp((logits[i] - sorted[0]) / temperature);
    total += p[i];
  }
  for (double& x : p) x /= total;
  return p;
}

TEST(PickTokenTest, GreedyTakesTheLargestLogitAndTheLowestIdOnTies) {
  data::SplitMix64 rng(1);
  const SampleOptions greedy{.temperature = 0};
  EXPECT_EQ(PickToken(std::vector<float>{0.5f, 2.0f, -1.0f, 1.9f}, greedy, rng), 1);
  EXPECT_EQ(PickToken(std::vector<float>{1.0f, 3.0f, 3.0f, 3.0f}, greedy, rng), 1);
  EXPECT_EQ(PickToken(std::vector<float>{7.0f}, greedy, rng), 0);
  // Greedy draws nothing: the generator is where it started.
  data::SplitMix64 fresh(1);
  EXPECT_EQ(rng.Next(), fresh.Next());
}

TEST(PickTokenTest, TopKOfOneIsGreedy) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<float> logits = RandomLogits(64, seed);
    if (seed % 5 == 0) logits[40] = logits[7] = 100.0f;  // a tie at the top: id 7 wins
    data::SplitMix64 rng(seed);
    const int32_t greedy = PickToken(logits, SampleOptions{.temperature = 0}, rng);
    for (double temperature : {0.1, 1.0, 5.0}) {
      EXPECT_EQ(PickToken(logits, SampleOptions{.temperature = temperature, .top_k = 1}, rng),
                greedy)
          << "seed " << seed << " temperature " << temperature;
    }
  }
}

TEST(PickTokenTest, TheSameSeedDrawsTheSameTokensAndAnotherSeedOthers) {
  const std::vector<float> logits = RandomLogits(256, 3, 1.0);
  auto draw = [&](uint64_t seed) {
    data::SplitMix64 rng(seed);
    std::vector<int32_t> ids;
    for (int i = 0; i < 200; ++i) {
      ids.push_back(PickToken(logits, SampleOptions{.temperature = 1.0, .top_k = 40}, rng));
    }
    return ids;
  };
  EXPECT_EQ(draw(17), draw(17));
  EXPECT_NE(draw(17), draw(18));
}

TEST(PickTokenTest, TopKDrawsOnlyTheKLargest) {
  const std::vector<float> logits = RandomLogits(50, 9);
  std::vector<int32_t> by_logit(logits.size());
  for (size_t i = 0; i < by_logit.size(); ++i) by_logit[i] = static_cast<int32_t>(i);
  std::sort(by_logit.begin(), by_logit.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const std::set<int32_t> top5(by_logit.begin(), by_logit.begin() + 5);
  data::SplitMix64 rng(4);
  std::set<int32_t> drawn;
  // A high temperature flattens the distribution: without the cut-off the
  // other 45 ids would take most of the draws.
  for (int i = 0; i < 20000; ++i) {
    drawn.insert(PickToken(logits, SampleOptions{.temperature = 10.0, .top_k = 5}, rng));
  }
  EXPECT_EQ(drawn, top5);
}

// Frequencies of many draws against the probabilities they are drawn from.
// Tolerance: 5 standard deviations of a frequency, sqrt(p (1 - p) / n), so
// a correct sampler stays inside with probability > 1 - 1e-6 per id (and the
// seed is fixed, so the test is deterministic).
void ExpectFrequenciesMatch(const std::vector<float>& logits, double temperature, int top_k) {
  constexpr int kDraws = 200000;
  const std::vector<double> p = Probabilities(logits, temperature, top_k);
  std::vector<int> counts(logits.size(), 0);
  data::SplitMix64 rng(2024);
  const SampleOptions options{.temperature = temperature, .top_k = top_k};
  for (int i = 0; i < kDraws; ++i) ++counts[PickToken(logits, options, rng)];
  for (size_t id = 0; id < logits.size(); ++id) {
    const double frequency = static_cast<double>(counts[id]) / kDraws;
    const double sigma = std::sqrt(p[id] * (1 - p[id]) / kDraws);
    EXPECT_NEAR(frequency, p[id], 5 * sigma + 1e-12)
        << "id " << id << ", temperature " << temperature << ", top_k " << top_k;
  }
}

TEST(PickTokenTest, FrequenciesMatchTheSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f};
  ExpectFrequenciesMatch(logits, 1.0, 0);
  ExpectFrequenciesMatch(logits, 0.7, 0);
  ExpectFrequenciesMatch(logits, 3.0, 0);
  ExpectFrequenciesMatch(logits, 1.0, 3);
}

TEST(PickTokenTest, AnUnderflowedProbabilityIsNeverDrawn) {
  // exp(-1000) is 0 in double.
  const std::vector<float> logits = {0.0f, 1000.0f, 0.0f};
  data::SplitMix64 rng(8);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(PickToken(logits, SampleOptions{.temperature = 1.0}, rng), 1);
  }
}

TEST(ValidateSampleOptionsTest, NamesTheField) {
  const int V = 100;
  EXPECT_TRUE(ValidateSampleOptions(SampleOptions{}, V).ok());
  auto message = [&](const SampleOptions& o) {
    const absl::Status s = ValidateSampleOptions(o, V);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    return std::string(s.message());
  };
  EXPECT_NE(message(SampleOptions{.tokens = 0}).find("tokens"), std::string::npos);
  EXPECT_NE(message(SampleOptions{.tokens = kMaxSampleTokens + 1}).find("tokens"),
            std::string::npos);
  EXPECT_NE(message(SampleOptions{.temperature = -0.5}).find("temperature"), std::string::npos);
  EXPECT_NE(message(SampleOptions{.temperature = std::numeric_limits<double>::quiet_NaN()})
                .find("temperature"),
            std::string::npos);
  EXPECT_NE(message(SampleOptions{.temperature = kMaxTemperature * 2}).find("temperature"),
            std::string::npos);
  EXPECT_NE(message(SampleOptions{.top_k = -1}).find("top_k"), std::string::npos);
  EXPECT_NE(message(SampleOptions{.top_k = 101}).find("top_k"), std::string::npos);
  EXPECT_NE(message(SampleOptions{.top_k = 11, .vocab_limit = 10}).find("top_k"),
            std::string::npos);
  EXPECT_NE(message(SampleOptions{.vocab_limit = 101}).find("vocab_limit"), std::string::npos);
  EXPECT_TRUE(ValidateSampleOptions(SampleOptions{.top_k = 10, .vocab_limit = 10}, V).ok());
}

class GenerateTest : public ::testing::Test {
 protected:
  // vocab 40 pads to 128; context 8.
  const model::GptConfig config_{
      .layers = 2, .heads = 2, .width = 32, .vocab_size = 40, .context_length = 8};
  compute::CpuBackend backend_{compute::CpuBackendOptions{.num_threads = 2}};
  std::unique_ptr<model::GptModel> model_;

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<model::GptModel>> created =
        model::GptModel::Create(config_, &backend_, model::ModelOptions{});
    ASSERT_TRUE(created.ok()) << created.status();
    model_ = *std::move(created);
    model_->InitializeParameters(7);
    // Matrices 10x GPT-2's initial scale: attention and MLP then outweigh
    // the tied embedding, whose pull makes an initialised model repeat its
    // last token whatever the context.
    for (model::ParamId id : {model::kQkvw, model::kAttprojw, model::kFcw, model::kFcprojw}) {
      const model::ParameterInfo& info = model_->table()[id];
      for (size_t i = info.offset; i < info.end(); ++i) model_->params()[i] *= 10.0f;
    }
  }

  // The greedy choice after `tokens`, computed here: the forward pass over
  // the newest context_length tokens, argmax over the real vocabulary.
  int32_t GreedyAfter(const std::vector<int32_t>& tokens) {
    const int n = std::min<int>(static_cast<int>(tokens.size()), config_.context_length);
    const std::vector<int32_t> window(tokens.end() - n, tokens.end());
    const std::vector<int32_t> targets(n, 0);
    EXPECT_TRUE(model_->Forward(window.data(), targets.data(), 1, n).ok());
    std::vector<float> logits(model_->logits().numel);
    EXPECT_TRUE(model_->CopyLogitsToHost(logits.data()).ok());
    const float* row = logits.data() + static_cast<size_t>(n - 1) * config_.PaddedVocab();
    return static_cast<int32_t>(std::max_element(row, row + config_.vocab_size) - row);
  }
};

TEST_F(GenerateTest, RunsPastTheContextOnTheNewestTokens) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  std::vector<int> observed;
  absl::StatusOr<std::vector<int32_t>> generated =
      Generate(*model_, prompt, SampleOptions{.tokens = 20, .temperature = 0},
               [&](int done) { observed.push_back(done); });
  ASSERT_TRUE(generated.ok()) << generated.status();
  ASSERT_EQ(generated->size(), 20u);
  EXPECT_EQ(observed.size(), 20u);
  EXPECT_EQ(observed.back(), 20);
  std::vector<int32_t> tokens = prompt;
  for (int32_t id : *generated) {
    EXPECT_EQ(id, GreedyAfter(tokens)) << "after " << tokens.size() << " tokens";
    tokens.push_back(id);
  }
  // Not one id repeated, which would hide which tokens the model saw.
  EXPECT_GE(std::set<int32_t>(generated->begin(), generated->end()).size(), 4u);
}

TEST_F(GenerateTest, AConstantPromptBeyondTheContextEqualsItsCroppedSelf) {
  // Only the newest context_length tokens matter: a prompt of 30 tokens and
  // its last 8 continue alike.
  std::vector<int32_t> prompt(30);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((7 * i) % 40);
  const std::vector<int32_t> cropped(prompt.end() - config_.context_length, prompt.end());
  const SampleOptions options{.tokens = 10, .temperature = 0.8, .seed = 5};
  absl::StatusOr<std::vector<int32_t>> whole = Generate(*model_, prompt, options);
  absl::StatusOr<std::vector<int32_t>> tail = Generate(*model_, cropped, options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(*whole, *tail);
}

TEST_F(GenerateTest, NeverPicksAPaddingColumn) {
  // Padding rows of wte far larger than the real ones: their logits would
  // win if the padding columns were candidates.
  const model::ParameterInfo& wte = model_->table()[model::kWte];
  float* rows = model_->params() + wte.offset;
  for (int v = config_.vocab_size; v < config_.PaddedVocab(); ++v) {
    for (int c = 0; c < config_.width; ++c) {
      rows[static_cast<size_t>(v) * config_.width + c] =
          50.0f * rows[static_cast<size_t>(v % config_.vocab_size) * config_.width + c] + 1.0f;
    }
  }
  for (double temperature : {0.0, 1.0}) {
    absl::StatusOr<std::vector<int32_t>> generated =
        Generate(*model_, std::vector<int32_t>{1, 2},
                 SampleOptions{.tokens = 30, .temperature = temperature});
    ASSERT_TRUE(generated.ok()) << generated.status();
    for (int32_t id : *generated) EXPECT_LT(id, config_.vocab_size);
  }
}

TEST_F(GenerateTest, DrawsOnlyBelowTheVocabLimit) {
  absl::StatusOr<std::vector<int32_t>> generated =
      Generate(*model_, std::vector<int32_t>{1, 2},
               SampleOptions{.tokens = 50, .temperature = 5.0, .vocab_limit = 10});
  ASSERT_TRUE(generated.ok()) << generated.status();
  for (int32_t id : *generated) EXPECT_LT(id, 10);
}

TEST_F(GenerateTest, IsDeterministicForASeed) {
  const std::vector<int32_t> prompt = {5, 6, 7};
  auto run = [&](uint64_t seed) {
    absl::StatusOr<std::vector<int32_t>> generated =
        Generate(*model_, prompt, SampleOptions{.tokens = 30, .temperature = 1.5, .seed = seed});
    EXPECT_TRUE(generated.ok()) << generated.status();
    return generated.value_or(std::vector<int32_t>{});
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

TEST_F(GenerateTest, RefusesBadPromptsAndOptions) {
  const SampleOptions options{.tokens = 2};
  EXPECT_TRUE(absl::IsInvalidArgument(Generate(*model_, std::vector<int32_t>{}, options).status()));
  const absl::Status out_of_range =
      Generate(*model_, std::vector<int32_t>{1, 40}, options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(out_of_range)) << out_of_range;
  EXPECT_NE(out_of_range.message().find("prompt token 1"), std::string::npos) << out_of_range;
  EXPECT_TRUE(absl::IsInvalidArgument(
      Generate(*model_, std::vector<int32_t>{1}, SampleOptions{.tokens = 0}).status()));
}

TEST_F(GenerateTest, NonFiniteLogitsAreDataLoss) {
  const model::ParameterInfo& lnfw = model_->table()[model::kLnfw];
  std::fill(model_->params() + lnfw.offset, model_->params() + lnfw.end(),
            std::numeric_limits<float>::quiet_NaN());
  const absl::Status status =
      Generate(*model_, std::vector<int32_t>{1, 2}, SampleOptions{.tokens = 3}).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
}

}  // namespace
}  // namespace cohort::sample
