// The determinism contract on the data side: the samples of step s depend on
// (seed, s) alone, whatever the split of the batch across calls (ranks).

#include "worker/data/batch_sampler.h"

#include <numeric>
#include <set>
#include <vector>

#include "common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::data {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kContext = 16;
constexpr int kBatch = 8;

// Three shards whose tokens encode their position, so a window's content
// says where it came from: token = shard * 10000 + offset (mod 65536 is not
// reached at these sizes).
TokenDataset PositionalDataset() {
  std::vector<std::vector<uint16_t>> shards;
  for (int shard = 0; shard < 3; ++shard) {
    std::vector<uint16_t> tokens(static_cast<size_t>(500 + 700 * shard));
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<uint16_t>(shard * 10000 + static_cast<int>(i));
    }
    shards.push_back(std::move(tokens));
  }
  return TokenDataset::FromMemory(std::move(shards));
}

BatchSampler MakeSampler(const TokenDataset& dataset, SamplerOptions options) {
  absl::StatusOr<BatchSampler> sampler = BatchSampler::Create(dataset, options);
  CHECK(sampler.ok()) << sampler.status();
  return *std::move(sampler);
}

struct Batch {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// Fills the whole batch of `step` as `dp` ranks would: rank r asks for
// samples [r*B/dp, (r+1)*B/dp), and the results are concatenated.
Batch FillAsRanks(const BatchSampler& sampler, Step step, int dp) {
  Batch batch{std::vector<int32_t>(kBatch * kContext), std::vector<int32_t>(kBatch * kContext)};
  const int per_rank = kBatch / dp;
  for (int r = 0; r < dp; ++r) {
    const size_t at = static_cast<size_t>(r * per_rank * kContext);
    const absl::Status status = sampler.Fill(step, r * per_rank, per_rank, batch.inputs.data() + at,
                                             batch.targets.data() + at);
    CHECK(status.ok()) << status;
  }
  return batch;
}

TEST(BatchSamplerTest, BatchIsIndependentOfTheDataParallelSplit) {
  const TokenDataset dataset = PositionalDataset();
  const BatchSampler sampler =
      MakeSampler(dataset, {.seed = 7, .context_length = kContext, .global_batch_size = kBatch});
  for (int64_t s : {0, 1, 17, 123456789}) {
    const Batch one = FillAsRanks(sampler, Step(s), 1);
    for (int dp : {2, 4, 8}) {
      const Batch split = FillAsRanks(sampler, Step(s), dp);
      EXPECT_EQ(split.inputs, one.inputs) << "step " << s << " dp " << dp;
      EXPECT_EQ(split.targets, one.targets) << "step " << s << " dp " << dp;
    }
    // A second sampler over the same data and seed (another process) agrees.
    const BatchSampler again =
        MakeSampler(dataset, {.seed = 7, .context_length = kContext, .global_batch_size = kBatch});
    EXPECT_EQ(FillAsRanks(again, Step(s), 2).inputs, one.inputs);
  }
}

TEST(BatchSamplerTest, TargetsAreInputsShiftedByOneInsideTheShard) {
  const TokenDataset dataset = PositionalDataset();
  const BatchSampler sampler =
      MakeSampler(dataset, {.seed = 3, .context_length = kContext, .global_batch_size = kBatch});
  for (int64_t s = 0; s < 50; ++s) {
    const Batch batch = FillAsRanks(sampler, Step(s), 1);
    for (int j = 0; j < kBatch; ++j) {
      const SampleLocation where = sampler.Locate(Step(s), j);
      const std::span<const uint16_t> shard = dataset.shard(where.shard);
      ASSERT_LE(where.offset + kContext + 1, static_cast<int64_t>(shard.size()));
      for (int t = 0; t < kContext; ++t) {
        const size_t i = static_cast<size_t>(j * kContext + t);
        ASSERT_EQ(batch.inputs[i], shard[static_cast<size_t>(where.offset + t)]);
        ASSERT_EQ(batch.targets[i], shard[static_cast<size_t>(where.offset + t + 1)]);
      }
    }
  }
}

TEST(BatchSamplerTest, StepsSamplesAndSeedsGiveDifferentWindows) {
  const TokenDataset dataset = PositionalDataset();
  const BatchSampler sampler =
      MakeSampler(dataset, {.seed = 7, .context_length = kContext, .global_batch_size = kBatch});
  const BatchSampler other_seed =
      MakeSampler(dataset, {.seed = 8, .context_length = kContext, .global_batch_size = kBatch});
  EXPECT_NE(FillAsRanks(sampler, Step(0), 1).inputs, FillAsRanks(sampler, Step(1), 1).inputs);
  EXPECT_NE(FillAsRanks(sampler, Step(0), 1).inputs, FillAsRanks(other_seed, Step(0), 1).inputs);
  // 3552 windows in all: 400 (step, sample) keys collide ~22 times on average.
  std::set<std::pair<int, int64_t>> seen;
  for (int64_t s = 0; s < 50; ++s) {
    for (int j = 0; j < kBatch; ++j) {
      const SampleLocation where = sampler.Locate(Step(s), j);
      seen.insert({where.shard, where.offset});
    }
  }
  EXPECT_GT(seen.size(), 350u);
}

TEST(BatchSamplerTest, WindowsAreUniformOverAllStartsAndSkipShortShards) {
  // Shard 1 is too short for a window (T + 1 = 17 tokens needed); shard 0 has
  // 100 window starts and shard 2 has 300, so shard 2 must get 3/4 of the
  // samples and every start must be reachable.
  std::vector<std::vector<uint16_t>> shards = {std::vector<uint16_t>(100 + kContext, 1),
                                               std::vector<uint16_t>(kContext, 2),
                                               std::vector<uint16_t>(300 + kContext, 3)};
  const TokenDataset dataset = TokenDataset::FromMemory(std::move(shards));
  const BatchSampler sampler =
      MakeSampler(dataset, {.seed = 11, .context_length = kContext, .global_batch_size = 64});
  EXPECT_EQ(sampler.total_windows(), 400);
  std::vector<int> per_shard(3, 0);
  std::set<std::pair<int, int64_t>> starts;
  const int steps = 1000;
  for (int64_t s = 0; s < steps; ++s) {
    for (int j = 0; j < 64; ++j) {
      const SampleLocation where = sampler.Locate(Step(s), j);
      ++per_shard[static_cast<size_t>(where.shard)];
      starts.insert({where.shard, where.offset});
    }
  }
  EXPECT_EQ(per_shard[1], 0);
  // 64000 draws, p = 0.75: standard deviation ~110; allow 5 sigma.
  EXPECT_NEAR(per_shard[2], 48000, 550);
  EXPECT_EQ(starts.size(), 400u);  // every start reached (expected misses ~ 400*e^-160)
}

TEST(BatchSamplerTest, LocationsArePinnedAcrossBuilds) {
  // The contract must hold across machines and rebuilds; this pins the hash.
  const TokenDataset dataset = PositionalDataset();
  const BatchSampler sampler =
      MakeSampler(dataset, {.seed = 7, .context_length = kContext, .global_batch_size = kBatch});
  std::vector<SampleLocation> got;
  for (int64_t s : {0, 5}) {
    for (int j = 0; j < 4; ++j) got.push_back(sampler.Locate(Step(s), j));
  }
  const std::vector<SampleLocation> pinned = {{1, 808},  {1, 929},  {2, 1833}, {2, 647},
                                              {2, 1283}, {2, 1754}, {2, 1881}, {2, 126}};
  EXPECT_EQ(got, pinned);
}

TEST(BatchSamplerTest, FillRejectsRangesOutsideTheBatch) {
  const TokenDataset dataset = PositionalDataset();
  const BatchSampler sampler =
      MakeSampler(dataset, {.seed = 7, .context_length = kContext, .global_batch_size = kBatch});
  std::vector<int32_t> in(kBatch * kContext, -1), out(kBatch * kContext, -1);
  EXPECT_EQ(sampler.Fill(Step(0), 6, 3, in.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.Fill(Step(0), -1, 1, in.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.Fill(Step(0), 0, -1, in.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.Fill(Step(-1), 0, 1, in.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.Fill(Step(0), 0, 1, nullptr, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing was written by the rejected calls.
  EXPECT_EQ(std::count(in.begin(), in.end(), -1), kBatch * kContext);
  EXPECT_TRUE(sampler.Fill(Step(0), 8, 0, nullptr, nullptr).ok());
}

TEST(BatchSamplerTest, CreateRejectsDataWithoutWindows) {
  const TokenDataset dataset = TokenDataset::FromMemory({{1, 2, 3}, {1, 2, 3, 4, 5}});
  absl::StatusOr<BatchSampler> sampler =
      BatchSampler::Create(dataset, {.seed = 1, .context_length = 5, .global_batch_size = 2});
  EXPECT_EQ(sampler.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sampler.status().message(), HasSubstr("context_length + 1 = 6"));
  EXPECT_THAT(sampler.status().message(), HasSubstr("memory[1], has 5"));
  // Exactly T + 1 tokens is one window.
  sampler = BatchSampler::Create(dataset, {.seed = 1, .context_length = 4, .global_batch_size = 2});
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  EXPECT_EQ(sampler->total_windows(), 1);
}

TEST(BatchSamplerTest, CreateRejectsBadShapes) {
  const TokenDataset dataset = PositionalDataset();
  EXPECT_THAT(BatchSampler::Create(dataset, {.context_length = 0, .global_batch_size = 1})
                  .status()
                  .message(),
              HasSubstr("context_length must be >= 1"));
  EXPECT_THAT(BatchSampler::Create(dataset, {.context_length = 4, .global_batch_size = 0})
                  .status()
                  .message(),
              HasSubstr("global_batch_size must be >= 1"));
}

TEST(BatchSamplerTest, MaxTokenIdRejectsTokensBeyondTheModelVocabulary) {
  const TokenDataset dataset = TokenDataset::FromMemory({{1, 2, 3, 4, 5}, {1, 2, 300, 4}});
  absl::StatusOr<BatchSampler> sampler = BatchSampler::Create(
      dataset, {.seed = 1, .context_length = 2, .global_batch_size = 2, .max_token_id = 255});
  EXPECT_EQ(sampler.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sampler.status().message(), HasSubstr("memory[1]: token 2 has id 300"));
  EXPECT_TRUE(
      BatchSampler::Create(
          dataset, {.seed = 1, .context_length = 2, .global_batch_size = 2, .max_token_id = 300})
          .ok());
}

}  // namespace
}  // namespace cohort::data
