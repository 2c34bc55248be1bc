#include "worker/train/adamw.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace cohort::train {
namespace {

const model::GptConfig kConfig{
    .layers = 2, .heads = 2, .width = 8, .vocab_size = 20, .context_length = 6};

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(WeightDecayRangesTest, WholeTableMergesNeighboursWithTheSameFlag) {
  const model::ParameterTable table(kConfig);
  const auto& t = table.tensors();
  using namespace model;  // NOLINT: ParamId names
  const std::vector<DecayRange> want = {
      {0, t[kWpe].end(), true},  // wte + wpe
      {t[kLn1w].offset, t[kLn1b].end(), false},
      {t[kQkvw].offset, t[kQkvw].end(), true},
      {t[kQkvb].offset, t[kQkvb].end(), false},
      {t[kAttprojw].offset, t[kAttprojw].end(), true},
      {t[kAttprojb].offset, t[kLn2b].end(), false},
      {t[kFcw].offset, t[kFcw].end(), true},
      {t[kFcb].offset, t[kFcb].end(), false},
      {t[kFcprojw].offset, t[kFcprojw].end(), true},
      {t[kFcprojb].offset, table.num_params(), false},
  };
  EXPECT_EQ(WeightDecayRanges(table, 0, table.num_params()), want);
}

TEST(WeightDecayRangesTest, ArbitrarySliceIsClipped) {
  const model::ParameterTable table(kConfig);
  const size_t qkvb = table[model::kQkvb].offset;
  const std::vector<DecayRange> got = WeightDecayRanges(table, qkvb - 5, qkvb + 3);
  EXPECT_EQ(got, (std::vector<DecayRange>{{qkvb - 5, qkvb, true}, {qkvb, qkvb + 3, false}}));
  EXPECT_TRUE(WeightDecayRanges(table, 10, 10).empty());
}

// torch.optim.AdamW's update for one element, in double.
double TorchAdamW(double p, double g, double& m, double& v, double lr, double wd, int step) {
  p *= 1 - lr * wd;
  m = 0.9 * m + 0.1 * g;
  v = 0.95 * v + 0.05 * g * g;
  const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
  return p - lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + 1e-8);
}

TEST(AdamWTest, MatchesTorchFormulaAndDecaysOnlyMatrices) {
  const model::ParameterTable table(kConfig);
  const size_t n = table.num_params();
  std::vector<float> p = Random(n, 1), m(n), v(n);
  std::vector<double> pd(p.begin(), p.end()), md(n), vd(n);
  const AdamWOptions options{.weight_decay = 0.1, .num_threads = 2};
  const auto ranges = WeightDecayRanges(table, 0, n);
  for (int step = 1; step <= 5; ++step) {
    const std::vector<float> g = Random(n, 100 + step);
    const double lr = 1e-2 * step;
    ASSERT_TRUE(
        AdamWUpdate(options, {p.data(), g.data(), m.data(), v.data(), 0, n}, ranges, lr, step)
            .ok());
    for (size_t i = 0; i < n; ++i) {
      const double wd = table.TensorAt(i).weight_decay ? 0.1 : 0.0;
      pd[i] = TorchAdamW(pd[i], g[i], md[i], vd[i], lr, wd, step);
    }
  }
  double max_err = 0.0;
  for (size_t i = 0; i < n; ++i) max_err = std::max(max_err, std::abs(p[i] - pd[i]));
  EXPECT_LT(max_err, 1e-6);
}

TEST(AdamWTest, ZeroGradientOnlyDecays) {
  const model::ParameterTable table(kConfig);
  const size_t n = table.num_params();
  std::vector<float> p(n, 1.0f), g(n, 0.0f), m(n), v(n);
  ASSERT_TRUE(AdamWUpdate(AdamWOptions{.weight_decay = 0.5},
                          {p.data(), g.data(), m.data(), v.data(), 0, n},
                          WeightDecayRanges(table, 0, n), 0.1, 1)
                  .ok());
  EXPECT_EQ(p[table[model::kQkvw].offset], 0.95f);  // decayed: 1 - 0.1 * 0.5
  EXPECT_EQ(p[table[model::kQkvb].offset], 1.0f);   // bias: untouched
  EXPECT_EQ(p[table[model::kLnfw].offset], 1.0f);   // LayerNorm: untouched
}

TEST(AdamWTest, ShardedUpdateIsBitwiseTheWholeUpdate) {
  // ZeRO-1: three ranks own uneven slices with their own m and v.
  const model::ParameterTable table(kConfig);
  const size_t n = table.num_params();
  const std::vector<float> p0 = Random(n, 2);
  std::vector<float> whole = p0, wm(n), wv(n);
  std::vector<float> sharded = p0;
  const size_t cuts[] = {0, 123, n / 2 + 7, n};
  std::vector<std::vector<float>> sm(3), sv(3);
  for (int r = 0; r < 3; ++r) sm[r].assign(cuts[r + 1] - cuts[r], 0.0f), sv[r] = sm[r];
  const AdamWOptions options{.weight_decay = 0.1, .num_threads = 3};
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = Random(n, 10 + step);
    ASSERT_TRUE(AdamWUpdate(options, {whole.data(), g.data(), wm.data(), wv.data(), 0, n},
                            WeightDecayRanges(table, 0, n), 3e-3, step)
                    .ok());
    for (int r = 0; r < 3; ++r) {
      const size_t b = cuts[r], e = cuts[r + 1];
      ASSERT_TRUE(
          AdamWUpdate(options,
                      {sharded.data() + b, g.data() + b, sm[r].data(), sv[r].data(), b, e - b},
                      WeightDecayRanges(table, b, e), 3e-3, step)
              .ok());
    }
  }
  EXPECT_EQ(std::memcmp(whole.data(), sharded.data(), n * sizeof(float)), 0);
  EXPECT_NE(whole, p0);
}

TEST(AdamWTest, RejectsBadArguments) {
  const model::ParameterTable table(kConfig);
  const size_t n = table.num_params();
  std::vector<float> p(n), g(n), m(n), v(n);
  const AdamWSlice slice{p.data(), g.data(), m.data(), v.data(), 0, n};
  const auto ranges = WeightDecayRanges(table, 0, n);
  EXPECT_EQ(AdamWUpdate({}, slice, ranges, 1e-3, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamWUpdate({}, slice, ranges, -1.0, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamWUpdate({}, slice, WeightDecayRanges(table, 0, n - 1), 1e-3, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamWUpdate({}, slice, WeightDecayRanges(table, 1, n), 1e-3, 1).code(),
            absl::StatusCode::kInvalidArgument);
  AdamWSlice null_m = slice;
  null_m.m = nullptr;
  EXPECT_EQ(AdamWUpdate({}, null_m, ranges, 1e-3, 1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::train
