#include "worker/model/model_layout.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/parameter_init.h"
#include "worker/model/parameter_table.h"

namespace cohort::model {
namespace {

// The small GPT: 4 layers, 4 heads, width 128, vocab 512, context 64.
const GptConfig kConfig{
    .layers = 4, .heads = 4, .width = 128, .vocab_size = 500, .context_length = 16};

TEST(ModelLayoutTest, StagesSplitLayersEvenlyEarlierStagesTakeTheRemainder) {
  GptConfig config = kConfig;
  config.layers = 7;
  const ModelLayout layout{.pp = 3};
  EXPECT_EQ(layout.FirstLayer(config, 0), 0);
  EXPECT_EQ(layout.FirstLayer(config, 1), 3);
  EXPECT_EQ(layout.FirstLayer(config, 2), 5);
  EXPECT_EQ(layout.FirstLayer(config, 3), 7);
  for (int s = 0; s < 3; ++s) {
    const ModelLayout at{.pp = 3, .stage = s};
    EXPECT_EQ(at.num_layers(config), s == 0 ? 3 : 2);
  }
}

TEST(ModelLayoutTest, ValidateNamesTheProblem) {
  EXPECT_TRUE((ModelLayout{.tp = 4, .tp_rank = 3, .pp = 4, .stage = 3}).Validate(kConfig).ok());
  const struct {
    ModelLayout layout;
    const char* needle;
  } bad[] = {
      {{.tp = 3}, "heads"},
      {{.tp = 0}, "must be >= 1"},
      {{.tp = 2, .tp_rank = 2}, "tp_rank"},
      {{.pp = 5}, "exceeds 4 layers"},
      {{.pp = 2, .stage = -1}, "stage"},
  };
  for (const auto& c : bad) {
    const absl::Status s = c.layout.Validate(kConfig);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s;
  }
  GptConfig odd_vocab = kConfig;
  odd_vocab.heads = 8;
  odd_vocab.padded_vocab = 508;  // 4 * 127: tp 8 cannot split it
  const absl::Status s = ModelLayout{.tp = 8}.Validate(odd_vocab);
  EXPECT_NE(s.message().find("padded vocabulary 508"), std::string::npos) << s;
}

// Every layout's shards, put back with InsertShard, cover every element of
// the unsharded parameters exactly once per copy (replicated tensors once
// per tensor rank, the tied wte twice under pp > 1: on the first and on the
// last stage), and each shard's initialisation is the unsharded
// initialisation's box.
TEST(ModelLayoutTest, ShardsTileTheUnshardedParameters) {
  const ParameterTable whole(kConfig);
  std::vector<float> reference(whole.num_params());
  InitializeParameters(kConfig, whole, 7, reference.data());
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 3, 4}) {
      std::vector<int> covered(whole.num_params(), 0);
      std::vector<float> rebuilt(whole.num_params(), -1.0f);
      for (int stage = 0; stage < pp; ++stage) {
        for (int r = 0; r < tp; ++r) {
          const ModelLayout layout{.tp = tp, .tp_rank = r, .pp = pp, .stage = stage};
          const ParameterTable table(kConfig, layout);
          std::vector<float> shard(table.num_params());
          InitializeParameters(kConfig, table, 7, shard.data());
          for (const ParameterInfo& info : table.tensors()) {
            const ParameterInfo& global = whole[info.id];
            std::vector<float> ones(info.numel);
            std::iota(ones.begin(), ones.end(), 0.0f);
            // Mark coverage: insert the element indices, then count them.
            std::vector<float> marks(global.numel, -1.0f);
            InsertShard(info, ones.data(), marks.data());
            for (size_t i = 0; i < global.numel; ++i) {
              if (marks[i] >= 0) ++covered[global.offset + i];
            }
            InsertShard(info, shard.data() + info.offset, rebuilt.data() + global.offset);
            size_t product = 1;
            for (int64_t d : info.shape) product *= static_cast<size_t>(d);
            EXPECT_EQ(product, info.numel) << info.name;
          }
        }
      }
      EXPECT_EQ(rebuilt, reference) << "tp " << tp << " pp " << pp;
      for (const ParameterInfo& info : whole.tensors()) {
        // Replicated tensors are held by every tensor rank.
        const int copies = info.shard == ShardKind::kReplicated ? tp : 1;
        const int expected = (info.id == kWte && pp > 1 ? 2 : 1) * copies;
        for (size_t i = info.offset; i < info.end(); ++i) {
          ASSERT_EQ(covered[i], expected) << info.name << " element " << i - info.offset
                                          << " tp " << tp << " pp " << pp;
        }
      }
    }
  }
}

TEST(ModelLayoutTest, ShardShapesFollowMegatron) {
  const ParameterTable t(kConfig, ModelLayout{.tp = 2, .tp_rank = 1, .pp = 2, .stage = 1});
  EXPECT_EQ(t[kWte].shape, (std::vector<int64_t>{256, 128}));  // vocab rows 256..511
  EXPECT_EQ(t[kWte].box_start, (std::vector<int64_t>{256, 0}));
  EXPECT_FALSE(t[kWpe].present());  // stage 1 of 2 has no position embedding
  EXPECT_EQ(t[kQkvw].shape, (std::vector<int64_t>{2, 192, 128}));  // 2 layers, (3, 64) rows
  EXPECT_EQ(t[kQkvw].box_start, (std::vector<int64_t>{2, 0, 64, 0}));
  EXPECT_EQ(t[kAttprojw].shape, (std::vector<int64_t>{2, 128, 64}));
  EXPECT_EQ(t[kFcw].shape, (std::vector<int64_t>{2, 256, 128}));
  EXPECT_EQ(t[kFcprojw].shape, (std::vector<int64_t>{2, 128, 256}));
  EXPECT_EQ(t[kFcprojb].shape, (std::vector<int64_t>{2, 128}));  // replicated
  EXPECT_TRUE(t[kLnfw].present());
  const ParameterTable first(kConfig, ModelLayout{.pp = 2, .stage = 0});
  EXPECT_FALSE(first[kLnfw].present());
  EXPECT_TRUE(first[kWpe].present());
  EXPECT_TRUE(first[kWte].present());
}

}  // namespace
}  // namespace cohort::model
