// TreeReducer (worker/train/tree_reducer.h) over InMemoryCommunicator: ranks
// as threads exchanging through the in-memory channel seam, whose sends
// complete only when their receive takes the bytes (so a buffer the
// reducer reused before its exchange finished would show). Every split of
// the micro-batches, even and uneven (ranks holding several tree nodes),
// gives every rank the single-process tree's bits, which are within
// M * 2^-24 * sum |x| of the sum in double; a failed peer ends the reduction
// with an error within its timeout; arguments that do not fit the ranges
// are refused.

#include "worker/train/tree_reducer.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/layout/mesh_layout.h"
#include "gtest/gtest.h"
#include "tests/testing/random_values.h"
#include "tests/testing/rank_threads.h"
#include "worker/comm/failed_peer.h"
#include "worker/comm/in_memory_communicator.h"
#include "worker/train/gradient_tree.h"
#include "worker/train/reduction_tree.h"

namespace cohort::train {
namespace {

constexpr size_t kCount = 40'003;  // odd: the owners' ranges are uneven
constexpr absl::Duration kTimeout = absl::Seconds(20);

// Leaves with mixed magnitudes, so another association order would show.
std::vector<std::vector<float>> RandomLeaves(int leaves, uint32_t seed) {
  return testing::RandomMixedMagnitudes(leaves, kCount, seed, 12);
}

// Rank `rank`'s tree over its leaves; its nodes are what TreeReducer takes.
GradientTree FoldLeaves(const std::vector<std::vector<float>>& leaves, LeafRange range) {
  GradientTree tree(kCount, static_cast<int>(leaves.size()), range, 1);
  tree.Begin();
  std::vector<float> scratch(kCount);
  for (int leaf = range.begin; leaf < range.end; ++leaf) {
    scratch = leaves[static_cast<size_t>(leaf)];  // overwritten between leaves, as a model's
    tree.Add(leaf, scratch.data(), /*kept=*/false);
  }
  return tree;
}

std::vector<float> SingleProcessTree(const std::vector<std::vector<float>>& leaves) {
  GradientTree tree = FoldLeaves(leaves, LeafRange{0, static_cast<int>(leaves.size())});
  const float* root = tree.Nodes()[0];
  return std::vector<float>(root, root + kCount);
}

std::vector<layout::ShardRange> Owners(int dp) {
  std::vector<layout::ShardRange> owners;
  for (int r = 0; r < dp; ++r) owners.push_back(layout::DataShardRange(kCount, dp, r));
  return owners;
}

struct Reduced {
  std::vector<absl::Status> statuses;
  std::vector<std::vector<float>> scattered;  // each rank's out after ReduceScatter
  std::vector<std::vector<float>> gathered;   // and after GatherRange of everything
};

// Reduces `leaves` split as `shares` over a fabric of shares.size() ranks.
Reduced Reduce(const std::vector<std::vector<float>>& leaves, const std::vector<int>& shares,
               comm::InMemoryFabric& fabric, absl::Duration timeout = kTimeout) {
  const int m = static_cast<int>(leaves.size());
  const int dp = static_cast<int>(shares.size());
  const std::vector<LeafRange> ranges = LeafRangesOf(shares);
  const std::vector<layout::ShardRange> owners = Owners(dp);
  Reduced reduced;
  reduced.scattered.resize(static_cast<size_t>(dp));
  reduced.gathered.resize(static_cast<size_t>(dp));
  reduced.statuses = testing::RunOnRankThreads(dp, [&](int r) -> absl::Status {
    comm::InMemoryCommunicator group(&fabric, r);
    GradientTree tree = FoldLeaves(leaves, ranges[static_cast<size_t>(r)]);
    TreeReducer reducer(m, ranges);
    const std::vector<float*> nodes = tree.Nodes();
    std::vector<float> out(kCount, std::nanf(""));
    if (absl::Status s = reducer.ReduceScatter(&group, nodes, owners, out.data(), 2, timeout);
        !s.ok()) {
      return s;
    }
    reduced.scattered[static_cast<size_t>(r)] = out;
    if (absl::Status s = TreeReducer::GatherRange(&group, owners, 0, kCount, out.data(), timeout);
        !s.ok()) {
      return s;
    }
    reduced.gathered[static_cast<size_t>(r)] = std::move(out);
    return absl::OkStatus();
  });
  return reduced;
}

TEST(TreeReducerTest, EverySplitGivesEveryRankTheSingleProcessTreesBits) {
  // (M, shares): even splits of a power of two (one node per rank), uneven
  // ones (ranks holding two or three nodes) and a split that is not the
  // planner's (the smaller share first).
  const std::vector<std::pair<int, std::vector<int>>> cases = {
      {4, {2, 2}},    {8, {2, 2, 2, 2}}, {6, {3, 3}},        {7, {3, 2, 2}},
      {8, {3, 3, 2}}, {5, {1, 4}},       {11, {3, 3, 3, 2}}, {8, {1, 1, 1, 1, 1, 1, 1, 1}}};
  for (const auto& [m, shares] : cases) {
    SCOPED_TRACE(absl::StrCat("M=", m, " shares=", absl::StrJoin(shares, ",")));
    const std::vector<std::vector<float>> leaves = RandomLeaves(m, static_cast<uint32_t>(m));
    const std::vector<float> want = SingleProcessTree(leaves);
    comm::InMemoryFabric fabric(static_cast<int>(shares.size()));
    const Reduced reduced = Reduce(leaves, shares, fabric);
    const std::vector<layout::ShardRange> owners = Owners(static_cast<int>(shares.size()));
    for (size_t r = 0; r < shares.size(); ++r) {
      ASSERT_TRUE(reduced.statuses[r].ok()) << "rank " << r << ": " << reduced.statuses[r];
      // After the reduce-scatter the owner's range holds the root's bits.
      for (size_t i = owners[r].begin; i < owners[r].end; ++i) {
        ASSERT_EQ(std::memcmp(&reduced.scattered[r][i], &want[i], 4), 0)
            << "rank " << r << " element " << i;
      }
      EXPECT_TRUE(std::memcmp(reduced.gathered[r].data(), want.data(), kCount * 4) == 0)
          << "rank " << r << " gathered other bits";
    }
  }
}

TEST(TreeReducerTest, TheTreeIsWithinFloatRoundingOfTheDoubleSum) {
  const int m = 7;
  const std::vector<std::vector<float>> leaves = RandomLeaves(m, 77);
  comm::InMemoryFabric fabric(3);
  const Reduced reduced = Reduce(leaves, {3, 2, 2}, fabric);
  for (const absl::Status& s : reduced.statuses) ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < kCount; ++i) {
    double exact = 0, magnitude = 0;
    for (const auto& leaf : leaves) {
      exact += leaf[i];
      magnitude += std::fabs(leaf[i]);
    }
    // M - 1 additions, each rounding by at most 2^-24 of a partial sum.
    ASSERT_LE(std::fabs(reduced.gathered[0][i] - exact), m * std::ldexp(1.0, -24) * magnitude)
        << "element " << i;
  }
}

TEST(TreeReducerTest, AFailedPeerEndsTheReductionWithAnErrorWithinTheTimeout) {
  const int m = 6;
  const std::vector<std::vector<float>> leaves = RandomLeaves(m, 6);
  comm::InMemoryFabric fabric(3);
  fabric.Fail(2);
  const absl::Duration timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  const Reduced reduced = Reduce(leaves, {2, 2, 2}, fabric, timeout);
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(1));
  // In the first round rank 0 waits to receive from rank 2 and rank 1
  // sends to it: both name it.
  for (int r : {0, 1}) {
    EXPECT_TRUE(absl::IsUnavailable(reduced.statuses[r]))
        << "rank " << r << ": " << reduced.statuses[r];
    EXPECT_EQ(comm::FailedPeer(reduced.statuses[r]).value_or(-1), 2) << "rank " << r;
  }
}

TEST(TreeReducerTest, NodesOrAGroupThatDoNotFitTheRangesAreInvalidArguments) {
  const std::vector<LeafRange> ranges = LeafRangesOf({3, 2});  // rank 0: nodes [0,2) and [2,3)
  TreeReducer reducer(5, ranges);
  ASSERT_EQ(reducer.nodes_of(0).size(), 2u);
  std::vector<float> node(kCount);
  comm::InMemoryFabric fabric(3);
  comm::InMemoryCommunicator three(&fabric, 0);
  const std::vector<layout::ShardRange> owners = Owners(2);
  // A group of three for two ranges.
  EXPECT_TRUE(absl::IsInvalidArgument(
      reducer.ReduceScatter(&three, {node.data(), node.data()}, owners, node.data(), 1, kTimeout)));
  // One node value where rank 0 holds two (alone: no exchange starts).
  comm::InMemoryFabric pair(2);
  comm::InMemoryCommunicator first(&pair, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(
      reducer.ReduceScatter(&first, {node.data()}, owners, node.data(), 1, kTimeout)));
}

}  // namespace
}  // namespace cohort::train
