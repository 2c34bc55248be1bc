// The deterministic reduction: the fixed tree over a step's micro-batches
// (reduction_tree.h), a rank's local folding (GradientTree) and the
// cross-rank combination (TreeReducer over in-process communicators).
//
// The property under test: for every micro-batch count M up to 17 and
// every split of the M leaves into contiguous ranges over 1..M ranks, the
// reduced vector is bitwise the single-process tree sum, and that sum is
// within float rounding of the exact (double) sum. Values are random with
// mixed magnitudes so that a different association order would show.

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/layout/mesh_layout.h"
#include "gtest/gtest.h"
#include "tests/testing/random_values.h"
#include "tests/testing/thread_comms.h"
#include "worker/train/gradient_tree.h"
#include "worker/train/reduction_tree.h"
#include "worker/train/tree_reducer.h"

namespace cohort::train {
namespace {

constexpr size_t kCount = 97;  // elements per gradient: odd, so shards are uneven

std::vector<std::vector<float>> RandomLeaves(int leaves, uint32_t seed) {
  return testing::RandomMixedMagnitudes(leaves, kCount, seed, 12);
}

// The single-process tree: one rank folding every leaf.
std::vector<float> SingleProcessTree(const std::vector<std::vector<float>>& leaves) {
  const int m = static_cast<int>(leaves.size());
  GradientTree tree(kCount, m, LeafRange{0, m}, 1);
  tree.Begin();
  std::vector<float> scratch(kCount);
  for (int i = 0; i < m; ++i) {
    scratch = leaves[i];  // the caller's buffer is overwritten between leaves
    tree.Add(i, scratch.data(), /*kept=*/false);
  }
  const std::vector<float*> nodes = tree.Nodes();
  EXPECT_EQ(nodes.size(), 1u) << "one rank's tree ends at its root";
  return std::vector<float>(nodes[0], nodes[0] + kCount);
}

// Reduces `leaves` split as `shares` over threads; returns every rank's view
// of the all-reduced vector (ReduceScatter, then GatherRange of everything).
std::vector<std::vector<float>> ReduceSplit(const std::vector<std::vector<float>>& leaves,
                                            const std::vector<int>& shares) {
  const int m = static_cast<int>(leaves.size());
  const int dp = static_cast<int>(shares.size());
  const std::vector<LeafRange> ranges = LeafRangesOf(shares);
  std::vector<layout::ShardRange> owners;
  for (int r = 0; r < dp; ++r) owners.push_back(layout::DataShardRange(kCount, dp, r));
  auto group = std::make_shared<testing::ThreadGroup>(dp);
  std::vector<std::vector<float>> results(static_cast<size_t>(dp), std::vector<float>(kCount));
  std::vector<std::thread> threads;
  for (int r = 0; r < dp; ++r) {
    threads.emplace_back([&, r] {
      testing::ThreadCommunicator comm(group, r);
      GradientTree tree(kCount, m, ranges[r], 1);
      tree.Begin();
      std::vector<float> scratch(kCount);
      for (int leaf = ranges[r].begin; leaf < ranges[r].end; ++leaf) {
        scratch = leaves[leaf];
        tree.Add(leaf, scratch.data(), /*kept=*/leaf + 1 == ranges[r].end);
      }
      TreeReducer reducer(m, ranges);
      std::vector<float*> nodes = tree.Nodes();
      ASSERT_EQ(nodes.size(), reducer.nodes_of(r).size());
      float* out = results[r].data();
      const absl::Status reduced =
          reducer.ReduceScatter(dp > 1 ? &comm : nullptr, nodes, owners, out, 1, absl::Seconds(10));
      ASSERT_TRUE(reduced.ok()) << reduced;
      const absl::Status gathered =
          TreeReducer::GatherRange(&comm, owners, 0, kCount, out, absl::Seconds(10));
      ASSERT_TRUE(gathered.ok()) << gathered;
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Random compositions of m into dp positive parts.
std::vector<int> RandomShares(int m, int dp, std::mt19937& rng) {
  std::vector<int> cuts;
  for (int c = 1; c < m; ++c) cuts.push_back(c);
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(static_cast<size_t>(dp - 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int> shares;
  int previous = 0;
  for (int c : cuts) {
    shares.push_back(c - previous);
    previous = c;
  }
  shares.push_back(m - previous);
  return shares;
}

TEST(ReductionTreeTest, TreeSumIsTheFixedTreeAndCloseToTheExactSum) {
  // Eight leaves: ((0+1)+(2+3))+((4+5)+(6+7)). Six: ((0+1)+(2+3))+(4+5).
  // Seven: ((0+1)+(2+3))+((4+5)+6).
  const double v[8] = {1e16, 1, -1e16, 1, 3, 5, 7, 11};
  EXPECT_EQ(TreeSum(v, 8), ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])));
  EXPECT_EQ(TreeSum(v, 6), ((v[0] + v[1]) + (v[2] + v[3])) + (v[4] + v[5]));
  EXPECT_EQ(TreeSum(v, 7), ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + v[6]));
  EXPECT_EQ(TreeSum(v, 1), v[0]);
}

TEST(ReductionTreeTest, RangeNodesAreTheMaximalNodesInsideTheRange) {
  EXPECT_EQ(RangeNodes(8, 0, 8), (std::vector<TreeNode>{{0, 8}}));
  EXPECT_EQ(RangeNodes(8, 0, 3), (std::vector<TreeNode>{{0, 2}, {2, 1}}));
  EXPECT_EQ(RangeNodes(8, 3, 6), (std::vector<TreeNode>{{3, 1}, {4, 2}}));
  EXPECT_EQ(RangeNodes(8, 6, 8), (std::vector<TreeNode>{{6, 2}}));
  // Seven leaves: [4, 7) is the whole right half (leaf 7 is absent).
  EXPECT_EQ(RangeNodes(7, 4, 7), (std::vector<TreeNode>{{4, 4}}));
  EXPECT_EQ(RangeNodes(7, 6, 7), (std::vector<TreeNode>{{6, 2}}));
  EXPECT_EQ(RangeNodes(6, 0, 6), (std::vector<TreeNode>{{0, 8}}));
}

TEST(ReductionTreeTest, MicroBatchSharesPutTheLargerFirst) {
  EXPECT_EQ(layout::MicroBatchShares(8, 3), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(layout::MicroBatchShares(6, 4), (std::vector<int>{2, 2, 1, 1}));
  EXPECT_EQ(layout::MicroBatchShares(8, 4), (std::vector<int>{2, 2, 2, 2}));
}

TEST(ReductionTreeTest, GradientTreeHoldsAtMostTheBuffersItAnnounces) {
  for (int m = 1; m <= 33; ++m) {
    EXPECT_LE(GradientTree::BuffersNeeded(m, {0, m}), static_cast<int>(std::ceil(std::log2(m))) + 1)
        << m << " leaves";
  }
  EXPECT_EQ(GradientTree::BuffersNeeded(8, {0, 8}), 3);  // [0,4) [4,6) [6] before leaf 7
  EXPECT_EQ(GradientTree::BuffersNeeded(1, {0, 1}), 0);  // the kept leaf itself
}

TEST(ReductionTreeTest, EverySplitOverEveryDegreeGivesTheSameBits) {
  std::mt19937 rng(20261205);
  int cases = 0;
  for (int m = 1; m <= 17; ++m) {
    const std::vector<std::vector<float>> leaves = RandomLeaves(m, 1000 + m);
    const std::vector<float> reference = SingleProcessTree(leaves);
    // Close to the exact sum: the tree adds m - 1 times.
    for (size_t e = 0; e < kCount; ++e) {
      double exact = 0, magnitude = 0;
      for (const auto& leaf : leaves) {
        exact += leaf[e];
        magnitude += std::fabs(leaf[e]);
      }
      EXPECT_NEAR(reference[e], exact, magnitude * 1e-6 * std::max(1, m)) << m << " leaves";
    }
    for (int dp = 1; dp <= std::min(m, 6); ++dp) {
      for (int trial = 0; trial < 3; ++trial) {
        const std::vector<int> shares = RandomShares(m, dp, rng);
        SCOPED_TRACE(absl::StrCat(m, " leaves over ", dp, " ranks, first share ", shares[0]));
        const std::vector<std::vector<float>> got = ReduceSplit(leaves, shares);
        for (int r = 0; r < dp; ++r) {
          ASSERT_EQ(std::memcmp(got[r].data(), reference.data(), kCount * sizeof(float)), 0)
              << "rank " << r;
        }
        ++cases;
      }
    }
  }
  std::printf("%d splits bitwise equal to the single-process tree\n", cases);
}

TEST(ReductionTreeTest, ASequentialSumWouldDiffer) {
  // The values above are mixed enough that the association order shows:
  // if this fails, the bitwise test proves nothing.
  const std::vector<std::vector<float>> leaves = RandomLeaves(8, 1008);
  const std::vector<float> tree = SingleProcessTree(leaves);
  std::vector<float> sequential = leaves[0];
  for (size_t i = 1; i < leaves.size(); ++i) {
    for (size_t e = 0; e < kCount; ++e) sequential[e] += leaves[i][e];
  }
  EXPECT_NE(std::memcmp(tree.data(), sequential.data(), kCount * sizeof(float)), 0);
}

}  // namespace
}  // namespace cohort::train
