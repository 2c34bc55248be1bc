#include "worker/model/parameter_table.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace cohort::model {
namespace {

TEST(ParameterTableTest, LlmcOrderShapesAndContiguousOffsets) {
  const GptConfig config{
      .layers = 3, .heads = 2, .width = 8, .vocab_size = 10, .context_length = 5};
  const ParameterTable table(config);
  const std::vector<std::string> names = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",
                                          "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
                                          "fcprojw",  "fcprojb",  "lnfw", "lnfb"};
  const std::vector<std::vector<int64_t>> shapes = {
      {128, 8}, {5, 8}, {3, 8},     {3, 8},  {3, 24, 8}, {3, 24}, {3, 8, 8}, {3, 8},
      {3, 8},   {3, 8}, {3, 32, 8}, {3, 32}, {3, 8, 32}, {3, 8},  {8},       {8}};
  ASSERT_EQ(table.tensors().size(), names.size());
  size_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const ParameterInfo& info = table.tensors()[i];
    EXPECT_EQ(info.id, static_cast<ParamId>(i));
    EXPECT_EQ(info.name, names[i]);
    EXPECT_EQ(info.shape, shapes[i]) << info.name;
    EXPECT_EQ(info.offset, offset) << info.name;
    size_t numel = 1;
    for (int64_t d : shapes[i]) numel *= d;
    EXPECT_EQ(info.numel, numel) << info.name;
    EXPECT_EQ(info.per_layer, shapes[i].size() >= 2 && i >= 2 && i < 14) << info.name;
    offset += numel;
  }
  EXPECT_EQ(table.num_params(), offset);
  EXPECT_EQ(table[kQkvw].LayerNumel(), 24u * 8);
  EXPECT_EQ(table[kWte].LayerNumel(), 128u * 8);
}

TEST(ParameterTableTest, Gpt2SmallHasTheLlmcParameterCount) {
  const GptConfig config{
      .layers = 12, .heads = 12, .width = 768, .vocab_size = 50257, .context_length = 1024};
  EXPECT_EQ(ParameterTable(config).num_params(), 124475904u);  // llm.c with Vp = 50304
}

TEST(ParameterTableTest, ShardingAndWeightDecayMetadata) {
  const ParameterTable table(
      GptConfig{.layers = 1, .heads = 1, .width = 4, .vocab_size = 7, .context_length = 3});
  using S = ShardKind;
  const S shard[] = {S::kSplitVocab,   S::kReplicated, S::kReplicated,   S::kReplicated,
                     S::kSplitHeads,   S::kSplitHeads, S::kSplitColumns, S::kReplicated,
                     S::kReplicated,   S::kReplicated, S::kSplitRows,    S::kSplitRows,
                     S::kSplitColumns, S::kReplicated, S::kReplicated,   S::kReplicated};
  const bool decay[] = {true,  true,  false, false, true, false, true,  false,
                        false, false, true,  false, true, false, false, false};
  for (const ParameterInfo& info : table.tensors()) {
    EXPECT_EQ(info.shard, shard[info.id]) << info.name << " " << ShardKindName(info.shard);
    EXPECT_EQ(info.weight_decay, decay[info.id]) << info.name;
  }
}

TEST(ParameterTableTest, FindAndTensorAt) {
  const ParameterTable table(
      GptConfig{.layers = 2, .heads = 2, .width = 4, .vocab_size = 7, .context_length = 3});
  ASSERT_NE(table.Find("fcb"), nullptr);
  EXPECT_EQ(table.Find("fcb")->id, kFcb);
  EXPECT_EQ(table.Find("nope"), nullptr);
  for (const ParameterInfo& info : table.tensors()) {
    EXPECT_EQ(table.TensorAt(info.offset).id, info.id);
    EXPECT_EQ(table.TensorAt(info.end() - 1).id, info.id);
  }
  EXPECT_DEATH(table.TensorAt(table.num_params()), "offset");
}

}  // namespace
}  // namespace cohort::model
