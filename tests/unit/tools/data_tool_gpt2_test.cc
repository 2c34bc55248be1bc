// cohort-data text --tokenizer gpt2: shards written in small chunks hold
// exactly the ids of encoding the whole input at once, split train/val by
// token count; the flags are checked; the binary runs it end to end.

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/gpt2_byte_alphabet.h"
#include "tests/testing/paths.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/token_shards.h"
#include "tools/data/data_tool.h"
#include "tools/data/text_shards.h"
#include "worker/data/gpt2_tokenizer.h"

namespace cohort::datatool {
namespace {

using ::testing::HasSubstr;

// A small GPT-2 style vocabulary: the 256 bytes and merges for common
// English pieces ("Ġ" is the space). Writes encoder.json and vocab.bpe into
// `dir`.
void WriteVocab(const std::string& dir) {
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"},    {"h", "e"},     {"Ġt", "he"}, {"i", "n"},   {"Ġ", "a"},  {"e", "r"},
      {"in", "g"},   {"Ġ", "s"},     {"o", "n"},   {"Ġ", "l"},   {"i", "ne"}, {"n", "e"},
      {"Ġl", "ine"}, {"Ġ", "o"},     {"Ġo", "f"},  {"Ġ", "f"},   {"Ġf", "i"}, {"Ġfi", "r"},
      {"Ġfir", "s"}, {"Ġfirs", "t"}, {"Ġ", "Ġ"},   {"ĠĠ", "ĠĠ"}, {"Ċ", "Ċ"},  {"Ã", "¤"}};
  std::vector<std::string> entries;
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    std::string token = testing::Gpt2ByteChar(b);
    if (token == "\"" || token == "\\") token = "\\" + token;
    entries.push_back(absl::StrCat("\"", token, "\": ", id++));
  }
  std::string merges_file = "#version: 0.2\n";
  for (const auto& [a, b] : merges) {
    entries.push_back(absl::StrCat("\"", a, b, "\": ", id++));
    absl::StrAppend(&merges_file, a, " ", b, "\n");
  }
  entries.push_back(absl::StrCat("\"<|endoftext|>\": ", id++));
  testing::WriteFile(dir + "/encoder.json", absl::StrCat("{", absl::StrJoin(entries, ", "), "}"));
  testing::WriteFile(dir + "/vocab.bpe", merges_file);
}

data::Gpt2Tokenizer LoadVocab(const std::string& dir) {
  absl::StatusOr<data::Gpt2Tokenizer> tokenizer =
      data::Gpt2Tokenizer::Load(dir + "/encoder.json", dir + "/vocab.bpe");
  CHECK(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

// Two files with words, numbers, runs of spaces and newlines, non-ASCII
// letters and a stray invalid byte: safe cuts of every kind.
std::string TwoFileCorpus(const std::string& dir, std::vector<std::string>* inputs) {
  std::string a, b;
  for (int i = 0; i < 300; ++i) {
    absl::StrAppend(&a, "line ", i, " of the first file,   indented\n", i % 7 == 0 ? "\n\n" : "");
  }
  for (int i = 0; i < 200; ++i) {
    absl::StrAppend(&b, "zweite Datei, Zeile ", i, " \xc3\xa4\xc3\xa4 \xe6\x97\xa5\xe6\x9c\xac",
                    i % 50 == 0 ? "\xff" : "", " they'll\t\n");
  }
  testing::WriteFile(dir + "/a.txt", a);
  testing::WriteFile(dir + "/b.txt", b);
  *inputs = {dir + "/a.txt", dir + "/b.txt"};
  return a + b;
}

TEST(DataToolGpt2Test, ChunkedShardsEqualEncodingTheWholeText) {
  const std::string dir = testing::MakeTempDir("datagpt2");
  WriteVocab(dir);
  const data::Gpt2Tokenizer tokenizer = LoadVocab(dir);
  TextShardsOptions options;
  const std::string corpus = TwoFileCorpus(dir, &options.inputs);
  const std::vector<uint16_t> expected = *tokenizer.Encode(corpus);
  ASSERT_LT(expected.size(), corpus.size() * 3 / 4) << "the merges should apply";

  // Chunks of a few hundred bytes: hundreds of cuts, some inside characters.
  for (const size_t chunk : {size_t{97}, size_t{1000}, size_t{1} << 20}) {
    SCOPED_TRACE(chunk);
    options.output_dir = absl::StrCat(dir, "/out", chunk);
    options.val_fraction = 0.2;
    options.shard_tokens = 1000;
    options.gpt2 = &tokenizer;
    options.read_chunk_bytes = chunk;
    options.max_carry_bytes = 4 * chunk;
    std::vector<int64_t> counted;
    options.count_progress = [&](int64_t done, int64_t total) { counted.push_back(done); };
    absl::StatusOr<TextShardsSummary> summary = WriteTextShards(options);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->forced_cuts, 0);
    EXPECT_EQ(summary->input_bytes, static_cast<int64_t>(corpus.size()));
    ASSERT_FALSE(counted.empty());
    EXPECT_EQ(counted.back(), static_cast<int64_t>(corpus.size()));

    std::vector<uint16_t> all = testing::ReadShardTokens(options.output_dir + "/train_*.bin");
    const std::vector<uint16_t> val = testing::ReadShardTokens(options.output_dir + "/val_*.bin");
    const int64_t total = static_cast<int64_t>(expected.size());
    EXPECT_EQ(static_cast<int64_t>(val.size()), std::llround(0.2 * static_cast<double>(total)));
    EXPECT_EQ(summary->split.train.tokens + summary->split.val->tokens, total);
    all.insert(all.end(), val.begin(), val.end());
    EXPECT_EQ(all, expected);
    EXPECT_EQ(*tokenizer.Decode(all), corpus);
  }
}

TEST(DataToolGpt2Test, TextWithoutSafeCutsIsCutAnywayAndStaysLossless) {
  const std::string dir = testing::MakeTempDir("datagpt2");
  WriteVocab(dir);
  const data::Gpt2Tokenizer tokenizer = LoadVocab(dir);
  // 5000 letters in a row, a two-byte letter at every position mod 3.
  std::string corpus = "start ";
  for (int i = 0; i < 2500; ++i) corpus += i % 3 == 0 ? "\xc3\xa4" : "x";
  corpus += " end\n";
  testing::WriteFile(dir + "/long.txt", corpus);
  TextShardsOptions options{.inputs = {dir + "/long.txt"},
                            .output_dir = dir + "/out",
                            .val_fraction = 0.0,
                            .gpt2 = &tokenizer,
                            .read_chunk_bytes = 100,
                            .max_carry_bytes = 400};
  absl::StatusOr<TextShardsSummary> summary = WriteTextShards(options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_GT(summary->forced_cuts, 0);
  EXPECT_FALSE(summary->split.val.has_value());
  // Lossless whatever the cut.
  EXPECT_EQ(*tokenizer.Decode(testing::ReadShardTokens(dir + "/out/train_*.bin")), corpus);
}

TEST(DataToolGpt2Test, RunDataToolPrintsTheTokenizer) {
  const std::string dir = testing::MakeTempDir("datagpt2");
  WriteVocab(dir);
  DataToolConfig config;
  const std::string corpus = TwoFileCorpus(dir, &config.inputs);
  config.command = "text";
  config.tokenizer = "gpt2";
  config.vocab_path = dir + "/encoder.json";
  config.merges_path = dir + "/vocab.bpe";
  config.output_dir = dir + "/out";
  config.val_fraction = 0.1;
  std::ostringstream out, err;
  const absl::Status status = RunDataTool(config, out, err);
  ASSERT_TRUE(status.ok()) << status;
  const int64_t total = static_cast<int64_t>(LoadVocab(dir).Encode(corpus)->size());
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("gpt2 tokenizer: vocab 281 (", dir,
                                                "/encoder.json), 24 merges; ", corpus.size(),
                                                " bytes in, ", total, " tokens")));
  const int64_t val = std::llround(0.1 * static_cast<double>(total));
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("train: ", total - val, " tokens in 1 shard(s)")));
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("val: ", val, " tokens in 1 shard(s)")));
  EXPECT_THAT(err.str(), HasSubstr("input bytes, counting tokens)"));
  EXPECT_THAT(err.str(), HasSubstr(absl::StrCat("100.0% (", total, " / ", total, " tokens)")));
}

TEST(DataToolGpt2Test, BadTokenizerFlagsNameTheFlag) {
  struct Case {
    void (*edit)(DataToolConfig*);
    absl::StatusCode code;
    const char* message;
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const Case cases[] = {
      {[](DataToolConfig* c) { c->tokenizer = "bpe"; }, kInvalid,
       "--tokenizer must be 'byte' or 'gpt2', got 'bpe'"},
      {[](DataToolConfig* c) { c->vocab_path.clear(); }, kInvalid,
       "--vocab is required with --tokenizer gpt2: the path of GPT-2's encoder.json"},
      {[](DataToolConfig* c) { c->merges_path.clear(); }, kInvalid,
       "--merges is required with --tokenizer gpt2: the path of GPT-2's vocab.bpe"},
      {[](DataToolConfig* c) {
         c->tokenizer = "byte";
         c->merges_path.clear();
       },
       kInvalid, "--vocab is only for 'text' with --tokenizer gpt2 (got --tokenizer byte)"},
      {[](DataToolConfig* c) { c->command = "synthetic"; }, kInvalid,
       "--tokenizer applies to 'text' only"},
      {[](DataToolConfig* c) {
         c->command = "synthetic";
         c->tokenizer = "byte";
         c->vocab_path.clear();
       },
       kInvalid,
       "--merges is only for 'text' with --tokenizer gpt2 (got --tokenizer byte and "
       "command 'synthetic')"},
      {[](DataToolConfig* c) { c->vocab_path += ".missing"; }, absl::StatusCode::kNotFound,
       "--tokenizer gpt2: encoder.json "},
      {[](DataToolConfig* c) { c->merges_path = c->vocab_path; }, kInvalid, "--tokenizer gpt2: "},
  };
  const std::string dir = testing::MakeTempDir("datagpt2");
  WriteVocab(dir);
  testing::WriteFile(dir + "/in.txt", "some text");
  for (const Case& c : cases) {
    DataToolConfig config;
    config.command = "text";
    config.inputs = {dir + "/in.txt"};
    config.tokenizer = "gpt2";
    config.vocab_path = dir + "/encoder.json";
    config.merges_path = dir + "/vocab.bpe";
    config.output_dir = dir + "/never";
    c.edit(&config);
    std::ostringstream out, err;
    const absl::Status status = RunDataTool(config, out, err);
    EXPECT_EQ(status.code(), c.code) << c.message << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/never"));
}

// The built binary; skips where it has not been built.
TEST(DataToolGpt2Test, BinaryWritesGpt2Shards) {
  const std::string binary = testing::BinaryPath("tools/cohort-data");
  if (!std::filesystem::exists(binary)) GTEST_SKIP() << binary << " not built";
  const std::string dir = testing::MakeTempDir("datagpt2bin");
  WriteVocab(dir);
  std::vector<std::string> inputs;
  const std::string corpus = TwoFileCorpus(dir, &inputs);
  absl::StatusOr<testing::CommandResult> result =
      testing::RunCommand(binary,
                          {"text", "--tokenizer", "gpt2", "--vocab", dir + "/encoder.json",
                           "--merges", dir + "/vocab.bpe", "--input", absl::StrJoin(inputs, ","),
                           "--output_dir", dir + "/out", "--val_fraction", "0.25"},
                          absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->exit_code, 0) << result->output;
  EXPECT_THAT(result->output, HasSubstr("gpt2 tokenizer: vocab 281"));
  std::vector<uint16_t> all = testing::ReadShardTokens(dir + "/out/train_*.bin");
  const std::vector<uint16_t> val = testing::ReadShardTokens(dir + "/out/val_*.bin");
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(all, *LoadVocab(dir).Encode(corpus));

  absl::StatusOr<testing::CommandResult> help =
      testing::RunCommand(binary, {"--help"}, absl::Seconds(60));
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_THAT(help->output, HasSubstr("-tokenizer"));
  EXPECT_THAT(help->output, HasSubstr("first pass counts the tokens"));
}

}  // namespace
}  // namespace cohort::datatool
