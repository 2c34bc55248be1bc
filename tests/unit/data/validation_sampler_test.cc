// ValidationSampler's fixed windows and TokenDataset::HoldOutTail's cut.

#include "worker/data/validation_sampler.h"

#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/token_dataset.h"

namespace cohort::data {
namespace {

std::vector<uint16_t> Iota(int n, int first = 0) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), static_cast<uint16_t>(first));
  return v;
}

TEST(ValidationSamplerTest, BatchesAreConsecutiveWindowsThatNeverCrossAShard) {
  // T = 4: a shard of 10 tokens holds (10 - 1) / 4 = 2 windows, of 9 tokens 2.
  std::vector<std::vector<uint16_t>> shards = {Iota(10, 0), Iota(9, 100)};
  const TokenDataset dataset = TokenDataset::FromMemory(std::move(shards));
  absl::StatusOr<ValidationSampler> sampler = ValidationSampler::Create(
      dataset, {.context_length = 4, .global_batch_size = 2, .batches = 2});
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  EXPECT_EQ(sampler->total_windows(), 4);
  std::vector<int32_t> inputs(8), targets(8);
  ASSERT_TRUE(sampler->Fill(0, 0, 2, inputs.data(), targets.data()).ok());
  EXPECT_EQ(inputs, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(targets, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_TRUE(sampler->Fill(1, 1, 1, inputs.data(), targets.data()).ok());
  EXPECT_EQ(std::vector<int32_t>(inputs.begin(), inputs.begin() + 4),
            (std::vector<int32_t>{104, 105, 106, 107}));
  EXPECT_EQ(std::vector<int32_t>(targets.begin(), targets.begin() + 4),
            (std::vector<int32_t>{105, 106, 107, 108}));
  EXPECT_FALSE(sampler->Fill(2, 0, 1, inputs.data(), targets.data()).ok());
  EXPECT_FALSE(sampler->Fill(0, 1, 2, inputs.data(), targets.data()).ok());
}

TEST(ValidationSamplerTest, TooFewWindowsNameTheFieldAndTheCounts) {
  const TokenDataset dataset = TokenDataset::FromTokens(Iota(40));
  absl::StatusOr<ValidationSampler> sampler = ValidationSampler::Create(
      dataset, {.context_length = 8, .global_batch_size = 4, .batches = 2});
  ASSERT_FALSE(sampler.ok());
  EXPECT_EQ(sampler.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sampler.status().message().find("data.validation"), std::string::npos);
  EXPECT_NE(sampler.status().message().find("holds 4"), std::string::npos) << sampler.status();
}

TEST(ValidationSamplerTest, TokenIdsAboveTheVocabularyAreRefused) {
  const TokenDataset dataset = TokenDataset::FromTokens(Iota(40));
  EXPECT_FALSE(ValidationSampler::Create(dataset, {.context_length = 4,
                                                   .global_batch_size = 1,
                                                   .batches = 1,
                                                   .max_token_id = 30})
                   .ok());
}

TEST(HoldOutTailTest, TheCutFallsInsideAShardAndTheTailKeepsTheOrder) {
  std::vector<std::vector<uint16_t>> shards = {Iota(60, 0), Iota(40, 1000)};
  absl::StatusOr<TokenDataset::Split> split =
      TokenDataset::HoldOutTail(TokenDataset::FromMemory(std::move(shards)), 0.5);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->kept.num_shards(), 1);
  EXPECT_EQ(split->kept.total_tokens(), 50);
  EXPECT_EQ(split->kept.shard(0).back(), 49);
  ASSERT_EQ(split->held_out.num_shards(), 2);
  EXPECT_EQ(split->held_out.shard(0).front(), 50);
  EXPECT_EQ(split->held_out.shard(0).size(), 10u);
  EXPECT_EQ(split->held_out.shard(1).front(), 1000);
  EXPECT_EQ(split->held_out.total_tokens(), 50);
}

TEST(HoldOutTailTest, FractionsOutsideTheOpenUnitIntervalAreRefused) {
  for (const double f : {0.0, 1.0, -0.1, 2.0}) {
    EXPECT_FALSE(TokenDataset::HoldOutTail(TokenDataset::FromTokens(Iota(10)), f).ok()) << f;
  }
}

}  // namespace
}  // namespace cohort::data
