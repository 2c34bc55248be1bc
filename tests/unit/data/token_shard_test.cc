// Token shards: llm.c layout, round trip through mmap, rejection of corrupt
// files, and TokenDataset over globs and memory.

#include "worker/data/token_shard.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "worker/data/token_dataset.h"

namespace cohort::data {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int32_t HeaderInt(const std::string& bytes, int index) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + 4 * index;
  return static_cast<int32_t>(p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t{p[3]} << 24));
}

std::vector<uint16_t> SampleTokens() { return {0, 1, 255, 256, 50256, 65535, 7, 7}; }

TEST(TokenShardTest, WritesTheLlmcLayout) {
  const std::string path = testing::MakeTempDir("shard") + "/a.bin";
  ASSERT_TRUE(WriteTokenShard(path, SampleTokens()).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * 8);
  EXPECT_EQ(HeaderInt(bytes, 0), 20240520);
  EXPECT_EQ(HeaderInt(bytes, 1), 1);
  EXPECT_EQ(HeaderInt(bytes, 2), 8);
  for (int i = 3; i < 256; ++i) ASSERT_EQ(HeaderInt(bytes, i), 0) << i;
  // Token 50256 = 0xC450, little-endian, right after the header.
  EXPECT_EQ(static_cast<unsigned char>(bytes[1024 + 2 * 4]), 0x50);
  EXPECT_EQ(static_cast<unsigned char>(bytes[1024 + 2 * 4 + 1]), 0xC4);
}

TEST(TokenShardTest, RoundTripsThroughMmap) {
  const std::string dir = testing::MakeTempDir("shard");
  const std::string path = dir + "/a.bin";
  ASSERT_TRUE(WriteTokenShard(path, SampleTokens()).ok());
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->path(), path);
  EXPECT_EQ(shard->size(), 8);
  EXPECT_THAT(shard->tokens(), ElementsAreArray(SampleTokens()));
  // Moving keeps the mapping valid.
  TokenShard moved = *std::move(shard);
  EXPECT_THAT(moved.tokens(), ElementsAreArray(SampleTokens()));
  // No temporary file is left behind.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "a.bin");
  }
  EXPECT_EQ(files, 1);
}

TEST(TokenShardTest, EmptyShardIsValid) {
  const std::string path = testing::MakeTempDir("shard") + "/empty.bin";
  ASSERT_TRUE(WriteTokenShard(path, {}).ok());
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->size(), 0);
}

TEST(TokenShardTest, OverwriteReplacesTheWholeFile) {
  const std::string path = testing::MakeTempDir("shard") + "/a.bin";
  ASSERT_TRUE(WriteTokenShard(path, SampleTokens()).ok());
  const std::vector<uint16_t> shorter = {9, 8, 7};
  ASSERT_TRUE(WriteTokenShard(path, shorter).ok());
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_THAT(shard->tokens(), ElementsAre(9, 8, 7));
}

TEST(TokenShardTest, MissingFileIsNotFound) {
  const std::string path = testing::MakeTempDir("shard") + "/missing.bin";
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(shard.status().message(), HasSubstr(path));
}

TEST(TokenShardTest, CorruptMagicIsDataLossNamingFileAndField) {
  const std::string path = testing::MakeTempDir("shard") + "/bad.bin";
  ASSERT_TRUE(WriteTokenShard(path, SampleTokens()).ok());
  std::string bytes = ReadBytes(path);
  bytes[0] ^= 0x01;
  WriteBytes(path, bytes);
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shard.status().message(), HasSubstr(path));
  EXPECT_THAT(shard.status().message(), HasSubstr("magic"));
}

// Issue 21: a glob matching any readable file showed its first bytes (as
// the magic, version and count) in the failed job's message.
TEST(TokenShardTest, AFileThatIsNoShardIsNotQuotedInTheError) {
  const std::string path = testing::MakeTempDir("shard") + "/passwd";
  std::string passwd = "root:x:0:0:root:/root:/bin/bash\n";
  passwd.resize(4096, '#');  // longer than a shard header
  WriteBytes(path, passwd);
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shard.status().message(), HasSubstr("not an llm.c token shard"));
  // "root" as a little-endian int32, and the next two words.
  for (const char* leaked : {"1953460082", "809138234", "1916416058"}) {
    EXPECT_THAT(shard.status().message(), ::testing::Not(HasSubstr(leaked))) << shard.status();
  }
}

TEST(TokenShardTest, TruncatedBodyIsDataLoss) {
  const std::string path = testing::MakeTempDir("shard") + "/short.bin";
  ASSERT_TRUE(WriteTokenShard(path, SampleTokens()).ok());
  std::filesystem::resize_file(path, 1024 + 2 * 8 - 1);
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shard.status().message(), HasSubstr(path));
  EXPECT_THAT(shard.status().message(), HasSubstr("truncated"));
}

TEST(TokenShardTest, TrailingBytesAreDataLoss) {
  const std::string path = testing::MakeTempDir("shard") + "/long.bin";
  ASSERT_TRUE(WriteTokenShard(path, SampleTokens()).ok());
  std::filesystem::resize_file(path, 1024 + 2 * 8 + 2);
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shard.status().message(), HasSubstr("trailing"));
}

TEST(TokenShardTest, ShorterThanHeaderIsDataLoss) {
  const std::string path = testing::MakeTempDir("shard") + "/tiny.bin";
  WriteBytes(path, std::string(100, '\0'));
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shard.status().message(), HasSubstr(path));
  EXPECT_THAT(shard.status().message(), HasSubstr("header"));
}

TEST(TokenShardTest, NegativeCountIsDataLoss) {
  const std::string path = testing::MakeTempDir("shard") + "/neg.bin";
  ASSERT_TRUE(WriteTokenShard(path, {}).ok());
  std::string bytes = ReadBytes(path);
  bytes[11] = static_cast<char>(0x80);  // count's sign bit
  WriteBytes(path, bytes);
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shard.status().message(), HasSubstr("token count"));
}

TEST(TokenShardTest, OtherVersionIsInvalidArgument) {
  const std::string path = testing::MakeTempDir("shard") + "/v2.bin";
  ASSERT_TRUE(WriteTokenShard(path, SampleTokens()).ok());
  std::string bytes = ReadBytes(path);
  bytes[4] = 2;
  WriteBytes(path, bytes);
  absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(), HasSubstr("version 2"));
  EXPECT_THAT(shard.status().message(), HasSubstr(path));
}

TEST(TokenShardTest, UnwritableDirectoryFails) {
  const absl::Status status = WriteTokenShard("/nonexistent-dir-for-test/a.bin", SampleTokens());
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("/nonexistent-dir-for-test/a.bin"));
}

TEST(TokenDatasetTest, GlobOpensMatchingShardsInSortedOrder) {
  const std::string dir = testing::MakeTempDir("dataset");
  // Written out of order; the dataset order must be by name.
  ASSERT_TRUE(WriteTokenShard(dir + "/train_000002.bin", std::vector<uint16_t>{3, 3}).ok());
  ASSERT_TRUE(WriteTokenShard(dir + "/train_000000.bin", std::vector<uint16_t>{1}).ok());
  ASSERT_TRUE(WriteTokenShard(dir + "/train_000001.bin", std::vector<uint16_t>{2, 2, 2}).ok());
  ASSERT_TRUE(WriteTokenShard(dir + "/val_000000.bin", std::vector<uint16_t>{9}).ok());
  absl::StatusOr<TokenDataset> dataset = TokenDataset::OpenGlob(dir + "/train_*.bin");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->num_shards(), 3);
  EXPECT_EQ(dataset->shard_name(0), dir + "/train_000000.bin");
  EXPECT_THAT(dataset->shard(0), ElementsAre(1));
  EXPECT_THAT(dataset->shard(1), ElementsAre(2, 2, 2));
  EXPECT_THAT(dataset->shard(2), ElementsAre(3, 3));
  EXPECT_EQ(dataset->total_tokens(), 6);
  EXPECT_EQ(dataset->MaxTokenId(), 3);
  // Spans survive a move of the dataset.
  TokenDataset moved = *std::move(dataset);
  EXPECT_THAT(moved.shard(1), ElementsAre(2, 2, 2));
}

TEST(TokenDatasetTest, GlobWithoutMatchIsNotFound) {
  const std::string dir = testing::MakeTempDir("dataset");
  absl::StatusOr<TokenDataset> dataset = TokenDataset::OpenGlob(dir + "/train_*.bin");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr(dir + "/train_*.bin"));
  dataset = TokenDataset::OpenGlob("/nonexistent-dir-for-test/train_*.bin");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenDatasetTest, GlobFailsOnACorruptShard) {
  const std::string dir = testing::MakeTempDir("dataset");
  ASSERT_TRUE(WriteTokenShard(dir + "/train_000000.bin", std::vector<uint16_t>{1}).ok());
  WriteBytes(dir + "/train_000001.bin", std::string(2000, 'x'));
  absl::StatusOr<TokenDataset> dataset = TokenDataset::OpenGlob(dir + "/train_*.bin");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr("train_000001.bin"));
}

TEST(TokenDatasetTest, FromMemoryNamesAndServesShards) {
  TokenDataset dataset = TokenDataset::FromMemory({{1, 2}, {}, {300}}, "synthetic");
  ASSERT_EQ(dataset.num_shards(), 3);
  EXPECT_EQ(dataset.shard_name(2), "synthetic[2]");
  EXPECT_THAT(dataset.shard(0), ElementsAre(1, 2));
  EXPECT_TRUE(dataset.shard(1).empty());
  EXPECT_EQ(dataset.total_tokens(), 3);
  EXPECT_EQ(dataset.MaxTokenId(), 300);
  TokenDataset single = TokenDataset::FromTokens({5, 6, 7});
  ASSERT_EQ(single.num_shards(), 1);
  EXPECT_THAT(single.shard(0), ElementsAre(5, 6, 7));
}

}  // namespace
}  // namespace cohort::data
