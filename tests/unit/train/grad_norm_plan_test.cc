#include "worker/train/grad_norm_plan.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/parameter_table.h"
#include "worker/train/grad_norm.h"

namespace cohort::train {
namespace {

using model::GptConfig;
using model::ModelLayout;
using model::ParameterTable;

// Big enough that wte and the matrices span several 16384-element pieces.
const GptConfig kConfig{
    .layers = 4, .heads = 4, .width = 128, .vocab_size = 500, .context_length = 64};

std::vector<float> RandomGradient(size_t n) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  return g;
}

// The norm a layout computes: every rank fills its slots from its shard of
// `whole_grad` (optionally only a ZeRO-1 range of dp shards), the slot
// vectors are summed as the groups would, then added in order.
double LayoutNorm(const std::vector<float>& whole_grad, int tp, int pp, int dp) {
  const ParameterTable whole(kConfig);
  std::vector<double> total;
  for (int stage = 0; stage < pp; ++stage) {
    for (int t = 0; t < tp; ++t) {
      const ParameterTable table(kConfig, ModelLayout{.tp = tp, .tp_rank = t, .pp = pp,
                                                      .stage = stage});
      std::vector<float> shard(table.num_params());
      for (const model::ParameterInfo& info : table.tensors()) {
        ExtractShard(info, whole_grad.data() + whole[info.id].offset, shard.data() + info.offset);
      }
      const GradNormPlan plan(kConfig, table);
      // ZeRO-1 ranges: shards of a multiple of 16384 elements, as DataParallel cuts them.
      const size_t padded_chunks = (table.num_params() + kSumOfSquaresChunk * dp - 1) /
                                   (kSumOfSquaresChunk * dp);
      const size_t shard_size = padded_chunks * kSumOfSquaresChunk;
      for (int d = 0; d < dp; ++d) {
        const size_t begin = std::min(table.num_params(), shard_size * d);
        const size_t end = std::min(table.num_params(), begin + shard_size);
        std::vector<double> slots;
        plan.Fill(shard.data(), begin, end, &slots, 2);
        if (total.empty()) total.assign(slots.size(), 0.0);
        EXPECT_EQ(slots.size(), total.size());
        for (size_t i = 0; i < slots.size(); ++i) total[i] += slots[i];
      }
    }
  }
  return GradNormPlan::Norm(total);
}

TEST(GradNormPlanTest, SingleProcessNormIsTheL2NormOfEveryParameter) {
  const ParameterTable whole(kConfig);
  const std::vector<float> g = RandomGradient(whole.num_params());
  double expected = 0;
  for (float x : g) expected += static_cast<double>(x) * x;
  EXPECT_NEAR(LayoutNorm(g, 1, 1, 1), std::sqrt(expected), 1e-12 * std::sqrt(expected));
}

TEST(GradNormPlanTest, PipelineAndZeroOneLayoutsHaveTheSingleProcessBits) {
  const ParameterTable whole(kConfig);
  const std::vector<float> g = RandomGradient(whole.num_params());
  const double reference = LayoutNorm(g, 1, 1, 1);
  for (int pp : {1, 2, 3, 4}) EXPECT_EQ(LayoutNorm(g, 1, pp, 1), reference) << "pp " << pp;
  for (int dp : {2, 3, 4}) EXPECT_EQ(LayoutNorm(g, 1, 1, dp), reference) << "dp " << dp;
}

TEST(GradNormPlanTest, TensorParallelCountsReplicatedTensorsOnce) {
  const ParameterTable whole(kConfig);
  const std::vector<float> g = RandomGradient(whole.num_params());
  const double reference = LayoutNorm(g, 1, 1, 1);
  for (int tp : {2, 4}) {
    for (int pp : {1, 2}) {
      for (int dp : {1, 2}) {
        // Other pieces, other order of the double sums: equal to rounding.
        EXPECT_NEAR(LayoutNorm(g, tp, pp, dp), reference, 1e-12 * reference)
            << "tp " << tp << " pp " << pp << " dp " << dp;
      }
    }
  }
}

}  // namespace
}  // namespace cohort::train
