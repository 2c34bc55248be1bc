// cohort-data end to end: text and synthetic shards written through the
// library entry point and through the built binary, read back and compared.

#include "tools/data/data_tool.h"

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/paths.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/token_shards.h"
#include "worker/data/byte_tokenizer.h"
#include "worker/data/markov_source.h"
#include "worker/data/token_dataset.h"

namespace cohort::datatool {
namespace {

using ::testing::HasSubstr;

std::string TwoFileCorpus(const std::string& dir, std::vector<std::string>* inputs) {
  std::string a, b;
  for (int i = 0; i < 300; ++i) a += "line " + std::to_string(i) + " of the first file\n";
  for (int i = 0; i < 200; ++i) b += "zweite Datei, Zeile " + std::to_string(i) + " \xc3\xa4\n";
  testing::WriteFile(dir + "/a.txt", a);
  testing::WriteFile(dir + "/b.txt", b);
  *inputs = {dir + "/a.txt", dir + "/b.txt"};
  return a + b;
}

TEST(DataToolTest, TextShardsDecodeBackToTheInput) {
  const std::string dir = testing::MakeTempDir("datatool");
  DataToolConfig config;
  const std::string corpus = TwoFileCorpus(dir, &config.inputs);
  config.command = "text";
  config.output_dir = dir + "/out";
  config.val_fraction = 0.1;
  config.shard_tokens = 4096;
  std::ostringstream out, err;
  const absl::Status status = RunDataTool(config, out, err);
  ASSERT_TRUE(status.ok()) << status;

  const int64_t total = static_cast<int64_t>(corpus.size());
  const int64_t val = std::llround(0.1 * static_cast<double>(total));
  const std::vector<uint16_t> train_tokens =
      testing::ReadShardTokens(config.output_dir + "/train_*.bin");
  const std::vector<uint16_t> val_tokens =
      testing::ReadShardTokens(config.output_dir + "/val_*.bin");
  EXPECT_EQ(static_cast<int64_t>(train_tokens.size()), total - val);
  EXPECT_EQ(static_cast<int64_t>(val_tokens.size()), val);
  std::vector<uint16_t> all = train_tokens;
  all.insert(all.end(), val_tokens.begin(), val_tokens.end());
  absl::StatusOr<std::string> decoded = data::ByteDecode(all);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, corpus);

  // Full shards of 4096 tokens, then the rest.
  const int64_t train_shards = (total - val + 4095) / 4096;
  EXPECT_TRUE(std::filesystem::exists(config.output_dir + "/train_000000.bin"));
  EXPECT_EQ(data::TokenDataset::OpenGlob(config.output_dir + "/train_*.bin")->num_shards(),
            train_shards);
  EXPECT_THAT(out.str(), HasSubstr("train: " + std::to_string(total - val) + " tokens in " +
                                   std::to_string(train_shards) + " shard(s)"));
  EXPECT_THAT(out.str(), HasSubstr("val: " + std::to_string(val) + " tokens in 1 shard(s)"));
  EXPECT_THAT(err.str(), HasSubstr("100.0%"));
}

TEST(DataToolTest, RefusesToMixWithOldShardsUnlessOverwrite) {
  const std::string dir = testing::MakeTempDir("datatool");
  DataToolConfig config;
  TwoFileCorpus(dir, &config.inputs);
  config.command = "text";
  config.output_dir = dir + "/out";
  config.shard_tokens = 1000;
  std::ostringstream out, err;
  ASSERT_TRUE(RunDataTool(config, out, err).ok());
  const absl::Status again = RunDataTool(config, out, err);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("--overwrite"));
  // With fewer, bigger shards the stale train_000005.bin etc. must vanish.
  config.overwrite = true;
  config.shard_tokens = 1'000'000;
  ASSERT_TRUE(RunDataTool(config, out, err).ok());
  EXPECT_EQ(data::TokenDataset::OpenGlob(config.output_dir + "/train_*.bin")->num_shards(), 1);
}

TEST(DataToolTest, SyntheticShardsEqualTheInProcessSource) {
  const std::string dir = testing::MakeTempDir("datatool");
  DataToolConfig config;
  config.command = "synthetic";
  config.output_dir = dir;
  config.seed = 99;
  config.tokens = 50'000;
  config.vocab_size = 512;
  config.alphabet = 12;
  config.branching = 3;
  config.shard_tokens = 20'000;
  config.val_fraction = 0.2;
  std::ostringstream out, err;
  const absl::Status status = RunDataTool(config, out, err);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(out.str(), HasSubstr("entropy floor: 1.098612 nats/token"));

  absl::StatusOr<data::MarkovSource> source = data::MarkovSource::Create(
      {.seed = 99, .vocab_size = 512, .alphabet_size = 12, .branching = 3});
  ASSERT_TRUE(source.ok());
  EXPECT_EQ(testing::ReadShardTokens(dir + "/train_*.bin"),
            source->Generate(40'000, data::kTrainStream));
  EXPECT_EQ(testing::ReadShardTokens(dir + "/val_*.bin"),
            source->Generate(10'000, data::kValStream));
  EXPECT_EQ(data::TokenDataset::OpenGlob(dir + "/train_*.bin")->num_shards(), 2);
}

TEST(DataToolTest, BadConfigurationsNameTheFlag) {
  struct Case {
    void (*edit)(DataToolConfig*);
    const char* message;
  };
  const Case cases[] = {
      {[](DataToolConfig* c) { c->command = ""; }, "no command given"},
      {[](DataToolConfig* c) { c->command = "tokens"; }, "unknown command 'tokens'"},
      {[](DataToolConfig* c) { c->output_dir = ""; }, "--output_dir is required"},
      {[](DataToolConfig* c) { c->val_fraction = 1.0; }, "--val_fraction must be in [0, 1), got 1"},
      {[](DataToolConfig* c) { c->shard_tokens = 0; }, "--shard_tokens must be in [1, 2147483647]"},
      {[](DataToolConfig* c) { c->shard_tokens = int64_t{1} << 31; }, "--shard_tokens"},
      {[](DataToolConfig* c) { c->tokens = 0; }, "--tokens must be >= 1, got 0"},
      {[](DataToolConfig* c) { c->vocab_size = 70000; }, "--vocab_size must be in [1, 65536]"},
      {[](DataToolConfig* c) { c->alphabet = 300; },
       "--alphabet must be in [1, --vocab_size=256], got 300"},
      {[](DataToolConfig* c) { c->branching = 17; },
       "--branching must be in [1, --alphabet=16], got 17"},
      {[](DataToolConfig* c) {
         c->command = "text";
         c->inputs.clear();
       },
       "--input is required"},
  };
  const std::string dir = testing::MakeTempDir("datatool");
  for (const Case& c : cases) {
    DataToolConfig config;
    config.command = "synthetic";
    config.output_dir = dir + "/never";
    config.tokens = 100;
    c.edit(&config);
    std::ostringstream out, err;
    const absl::Status status = RunDataTool(config, out, err);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/never"));
}

TEST(DataToolTest, MissingInputIsNotFound) {
  const std::string dir = testing::MakeTempDir("datatool");
  DataToolConfig config;
  config.command = "text";
  config.output_dir = dir + "/out";
  config.inputs = {dir + "/missing.txt"};
  std::ostringstream out, err;
  const absl::Status status = RunDataTool(config, out, err);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(dir + "/missing.txt"));
}

// The built binary, as a user runs it. The binary is a separate target; the
// test skips where it has not been built.
class DataBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    binary_ = testing::BinaryPath("tools/cohort-data");
    if (!std::filesystem::exists(binary_)) GTEST_SKIP() << binary_ << " not built";
  }
  std::string binary_;
};

TEST_F(DataBinaryTest, TextCommandWritesDecodableShards) {
  const std::string dir = testing::MakeTempDir("databin");
  std::vector<std::string> inputs;
  const std::string corpus = TwoFileCorpus(dir, &inputs);
  absl::StatusOr<testing::CommandResult> result =
      testing::RunCommand(binary_,
                          {"text", "--input", inputs[0] + "," + inputs[1], "--output_dir",
                           dir + "/out", "--val_fraction", "0.25", "--shard_tokens", "5000"},
                          absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->exit_code, 0) << result->output;
  std::vector<uint16_t> all = testing::ReadShardTokens(dir + "/out/train_*.bin");
  const std::vector<uint16_t> val = testing::ReadShardTokens(dir + "/out/val_*.bin");
  EXPECT_EQ(static_cast<int64_t>(val.size()),
            std::llround(0.25 * static_cast<double>(corpus.size())));
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(*data::ByteDecode(all), corpus);
}

TEST_F(DataBinaryTest, SyntheticCommandPrintsTheFloor) {
  const std::string dir = testing::MakeTempDir("databin");
  absl::StatusOr<testing::CommandResult> result =
      testing::RunCommand(binary_,
                          {"synthetic", "--seed", "5", "--tokens", "10000", "--vocab_size", "256",
                           "--alphabet", "16", "--branching", "4", "--output_dir", dir},
                          absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->exit_code, 0) << result->output;
  EXPECT_THAT(result->output, HasSubstr("entropy floor: 1.386294 nats/token"));
  EXPECT_EQ(testing::ReadShardTokens(dir + "/train_*.bin").size(), 9000u);
}

TEST_F(DataBinaryTest, BadFlagExitsTwoNamingTheFlag) {
  const std::string dir = testing::MakeTempDir("databin");
  absl::StatusOr<testing::CommandResult> result = testing::RunCommand(
      binary_, {"synthetic", "--branching", "0", "--output_dir", dir}, absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_THAT(result->output, HasSubstr("--branching must be in [1, --alphabet=16], got 0"));
}

}  // namespace
}  // namespace cohort::datatool
