// DataParallel (worker/train/data_parallel.h) over InMemoryCommunicator:
// data ranks as threads on the in-memory channel seam, so the reductions
// run the production ring and direct algorithms in process. Compared with
// one replica as the integration tests compare processes: the
// deterministic reduction has the single replica's bits for every degree
// and split, with ZeRO-1 or without; the transport's reduction is within
// dp * 2^-24 * sum |x| of the sum in double and the same on every rank;
// ZeRO-1's parameter gather makes every rank's weights whole; the loss sums
// are exact; a dead peer fails the step within the timeout.

#include "worker/train/data_parallel.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/layout/mesh_layout.h"
#include "gtest/gtest.h"
#include "tests/testing/random_values.h"
#include "tests/testing/rank_threads.h"
#include "worker/comm/in_memory_communicator.h"
#include "worker/train/gradient_tree.h"

namespace cohort::train {
namespace {

// Not a multiple of the shard alignment (16384): the last shard is short,
// and with dp 4 or more a rank owns nothing.
constexpr size_t kParams = 70'001;
constexpr int kMicroBatches = 6;

std::vector<std::vector<float>> RandomGradients(int count, uint32_t seed) {
  return testing::RandomMixedMagnitudes(count, kParams, seed, 10);
}

DataParallelOptions Options(bool zero1, bool deterministic, std::vector<int> shares) {
  DataParallelOptions options;
  options.zero1 = zero1;
  options.deterministic = deterministic;
  options.micro_batch_shares = std::move(shares);
  options.timeout = absl::Seconds(20);
  options.num_threads = 1;
  return options;
}

// Runs body(rank, data_parallel) on dp threads, each with its own
// InMemoryCommunicator of `fabric` (dp 1: no group).
std::vector<absl::Status> OnDataRanks(comm::InMemoryFabric& fabric,
                                      const std::function<DataParallelOptions(int)>& options,
                                      const std::function<absl::Status(int, DataParallel&)>& body) {
  return testing::RunOnRankThreads(fabric.size(), [&](int rank) {
    comm::InMemoryCommunicator group(&fabric, rank);
    DataParallel data_parallel(fabric.size() > 1 ? &group : nullptr, kParams, options(rank));
    return body(rank, data_parallel);
  });
}

// The micro-batch gradients of `leaves` folded by data rank `range`'s tree
// and reduced: every rank's view of the summed gradient (valid on its
// update range and `replicated` under ZeRO-1).
std::vector<std::vector<float>> TreeReduce(const std::vector<std::vector<float>>& leaves, int dp,
                                           bool zero1, layout::ShardRange replicated = {}) {
  const std::vector<int> shares = layout::MicroBatchShares(kMicroBatches, dp);
  const std::vector<LeafRange> ranges = LeafRangesOf(shares);
  std::vector<std::vector<float>> results(static_cast<size_t>(dp));
  comm::InMemoryFabric fabric(dp);
  const std::vector<absl::Status> statuses = OnDataRanks(
      fabric, [&](int) { return Options(zero1, true, shares); },
      [&](int rank, DataParallel& data_parallel) -> absl::Status {
        const LeafRange range = ranges[static_cast<size_t>(rank)];
        GradientTree tree(kParams, kMicroBatches, range, 1);
        tree.Begin();
        std::vector<float> scratch(kParams);
        for (int leaf = range.begin; leaf < range.end; ++leaf) {
          scratch = leaves[static_cast<size_t>(leaf)];
          tree.Add(leaf, scratch.data(), /*kept=*/false);
        }
        absl::StatusOr<float*> sum = data_parallel.ReduceGradientTree(tree.Nodes(), replicated);
        if (!sum.ok()) return sum.status();
        results[static_cast<size_t>(rank)].assign(*sum, *sum + kParams);
        return absl::OkStatus();
      });
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
  return results;
}

bool SameBits(const float* a, const float* b, size_t begin, size_t end) {
  return end <= begin || std::memcmp(a + begin, b + begin, (end - begin) * sizeof(float)) == 0;
}

TEST(DataParallelTest, TheTreeReductionHasTheSingleReplicasBitsForEveryDegreeAndZero1) {
  const std::vector<std::vector<float>> leaves = RandomGradients(kMicroBatches, 1);
  const std::vector<float> one = TreeReduce(leaves, 1, false)[0];
  ASSERT_EQ(one.size(), kParams);
  const layout::ShardRange replicated{100, 20'000};
  // dp 4 splits the 6 micro-batches 2, 2, 1, 1: ranks with one node and
  // ranks whose node is a single leaf.
  for (int dp : {2, 3, 4}) {
    for (bool zero1 : {false, true}) {
      SCOPED_TRACE(absl::StrCat("dp ", dp, zero1 ? " ZeRO-1" : ""));
      const std::vector<std::vector<float>> results = TreeReduce(leaves, dp, zero1, replicated);
      for (int r = 0; r < dp; ++r) {
        ASSERT_EQ(results[r].size(), kParams) << "rank " << r;
        if (!zero1) {
          EXPECT_TRUE(SameBits(results[r].data(), one.data(), 0, kParams)) << "rank " << r;
          continue;
        }
        const layout::ShardRange own = layout::DataShardRange(kParams, dp, r);
        EXPECT_TRUE(SameBits(results[r].data(), one.data(), own.begin, own.end)) << "rank " << r;
        EXPECT_TRUE(SameBits(results[r].data(), one.data(), replicated.begin, replicated.end))
            << "rank " << r << "'s replicated range";
      }
    }
  }
}

TEST(DataParallelTest, TheTransportReductionIsTheSumWithinRoundingOnEveryRank) {
  for (int dp : {2, 3}) {
    for (bool zero1 : {false, true}) {
      SCOPED_TRACE(absl::StrCat("dp ", dp, zero1 ? " ZeRO-1" : ""));
      const std::vector<std::vector<float>> grads = RandomGradients(dp, 2);
      std::vector<std::vector<float>> reduced = grads;
      std::vector<std::pair<size_t, size_t>> updates(static_cast<size_t>(dp));
      comm::InMemoryFabric fabric(dp);
      const std::vector<absl::Status> statuses = OnDataRanks(
          fabric, [&](int) { return Options(zero1, false, std::vector<int>(dp, 1)); },
          [&](int rank, DataParallel& data_parallel) {
            updates[rank] = {data_parallel.update_begin(), data_parallel.update_end()};
            return data_parallel.ReduceGradients(reduced[static_cast<size_t>(rank)].data());
          });
      for (int r = 0; r < dp; ++r) ASSERT_TRUE(statuses[r].ok()) << "rank " << r << statuses[r];
      for (int r = 0; r < dp; ++r) {
        const auto [begin, end] = updates[r];
        EXPECT_EQ(end - begin, zero1 ? layout::DataShardRange(kParams, dp, r).size() : kParams);
        for (size_t i = begin; i < end; ++i) {
          double exact = 0, magnitude = 0;
          for (const auto& g : grads) {
            exact += g[i];
            magnitude += std::fabs(g[i]);
          }
          ASSERT_LE(std::fabs(reduced[r][i] - exact), dp * std::ldexp(1.0, -24) * magnitude)
              << "rank " << r << " element " << i;
        }
        if (!zero1) {
          EXPECT_TRUE(reduced[r] == reduced[0]) << "rank " << r << " differs";
        }
      }
    }
  }
}

TEST(DataParallelTest, Zero1GatherMakesEveryRanksParametersWhole) {
  const int dp = 3;
  std::vector<float> whole(kParams);
  for (size_t i = 0; i < kParams; ++i) whole[i] = static_cast<float>(i) * 0.5f;
  std::vector<std::vector<float>> params(dp, std::vector<float>(kParams, -1.0f));
  comm::InMemoryFabric fabric(dp);
  const std::vector<absl::Status> statuses = OnDataRanks(
      fabric,
      [&](int) {
        return Options(true, true, {2, 2, 2});
      },
      [&](int rank, DataParallel& data_parallel) {
        // Only the own shard is up to date, as after the optimizer's update.
        float* mine = params[static_cast<size_t>(rank)].data();
        std::memcpy(mine + data_parallel.update_begin(),
                    whole.data() + data_parallel.update_begin(),
                    (data_parallel.update_end() - data_parallel.update_begin()) * sizeof(float));
        return data_parallel.GatherParameters(mine);
      });
  for (int r = 0; r < dp; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_TRUE(params[r] == whole) << "rank " << r;
  }
}

TEST(DataParallelTest, LossSumsAreExactOverTheGroup) {
  const int dp = 4;
  std::vector<double> sums(dp);
  std::vector<std::vector<double>> slots(dp, std::vector<double>(dp, 0.0));
  comm::InMemoryFabric fabric(dp);
  const std::vector<absl::Status> statuses = OnDataRanks(
      fabric,
      [&](int) {
        return Options(false, true, {1, 1, 1, 1});
      },
      [&](int rank, DataParallel& data_parallel) -> absl::Status {
        absl::StatusOr<double> sum = data_parallel.Sum(rank + 0.25);
        if (!sum.ok()) return sum.status();
        sums[rank] = *sum;
        // One non-zero per slot, as the per-micro-batch losses.
        slots[rank][rank] = 1.0 / (rank + 3);
        return data_parallel.SumInPlace(&slots[rank]);
      });
  std::vector<double> want(dp);
  for (int r = 0; r < dp; ++r) want[r] = 1.0 / (r + 3);
  for (int r = 0; r < dp; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(sums[r], 0.25 * dp + 6);
    EXPECT_EQ(slots[r], want) << "rank " << r;
  }
}

TEST(DataParallelTest, ADeadPeerFailsTheReductionWithinTheTimeout) {
  const int dp = 3;
  const std::vector<std::vector<float>> grads = RandomGradients(dp, 3);
  std::vector<std::vector<float>> reduced = grads;
  comm::InMemoryFabric fabric(dp);
  fabric.Fail(2);
  const absl::Time start = absl::Now();
  const std::vector<absl::Status> statuses = OnDataRanks(
      fabric,
      [&](int) {
        DataParallelOptions options = Options(false, true, {2, 2, 2});
        options.timeout = absl::Seconds(1);
        return options;
      },
      [&](int rank, DataParallel& data_parallel) -> absl::Status {
        if (rank == 2) return absl::UnavailableError("dead");
        return data_parallel.ReduceGradientTree({reduced[static_cast<size_t>(rank)].data()})
            .status();
      });
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (int r : {0, 1}) {
    EXPECT_TRUE(absl::IsUnavailable(statuses[r]) || absl::IsDeadlineExceeded(statuses[r]))
        << "rank " << r << ": " << statuses[r];
  }
  EXPECT_TRUE(absl::IsUnavailable(statuses[0]) || absl::IsUnavailable(statuses[1]))
      << "nobody saw rank 2 die";
}

}  // namespace
}  // namespace cohort::train
