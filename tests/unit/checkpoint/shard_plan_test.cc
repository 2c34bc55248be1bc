#include "worker/checkpoint/shard_plan.h"

#include <map>
#include <set>
#include <vector>

#include "coordinator/checkpoints/checkpoint_coverage.h"
#include "gtest/gtest.h"
#include "worker/train/data_parallel.h"

namespace cohort::checkpoint {
namespace {

const model::GptConfig kSmall{
    .layers = 4, .heads = 4, .width = 128, .vocab_size = 512, .context_length = 64};

struct Layout {
  int dp, tp, pp;
};

// Every rank of the layout, as (ParameterTable, RankPosition).
std::vector<std::pair<model::ParameterTable, RankPosition>> Ranks(const model::GptConfig& config,
                                                                  const Layout& l) {
  std::vector<std::pair<model::ParameterTable, RankPosition>> out;
  for (int stage = 0; stage < l.pp; ++stage) {
    for (int d = 0; d < l.dp; ++d) {
      for (int t = 0; t < l.tp; ++t) {
        const model::ModelLayout layout{.tp = l.tp, .tp_rank = t, .pp = l.pp, .stage = stage};
        out.emplace_back(model::ParameterTable(config, layout), RankPosition{{l.dp, l.tp, l.pp}, {d, t, stage}});
      }
    }
  }
  return out;
}

class ShardPlanTest : public ::testing::TestWithParam<Layout> {};

// The writers of a layout together cover every element of every catalogued
// tensor exactly once: the commit rule the coordinator applies.
TEST_P(ShardPlanTest, WritersOfALayoutCoverEveryTensorExactlyOnce) {
  const Layout l = GetParam();
  std::map<std::string, std::vector<Box>> boxes;
  for (const auto& [table, position] : Ranks(kSmall, l)) {
    for (const SavePiece& piece : PlanSave(table, position, /*max_chunk_elements=*/5000)) {
      EXPECT_LE(piece.count, 5000u);
      EXPECT_EQ(static_cast<int64_t>(piece.count), piece.box.NumElements());
      boxes[piece.tensor].push_back(piece.box);
    }
  }
  const std::vector<v1::TensorInfo> catalog = Catalog(kSmall);
  EXPECT_EQ(catalog.size(), 3u * model::kNumParamTensors);
  for (const v1::TensorInfo& tensor : catalog) {
    const std::vector<int64_t> shape(tensor.global_shape().begin(), tensor.global_shape().end());
    EXPECT_TRUE(coordinator::CheckCoverage(tensor.name(), shape, boxes[tensor.name()]).ok())
        << coordinator::CheckCoverage(tensor.name(), shape, boxes[tensor.name()]);
  }
}

// A piece's arena run holds its box's elements in row-major order: the
// element at flat offset arena_offset + k of the rank's arena is element k
// of the box, checked by reading a marked global tensor through the shard.
TEST_P(ShardPlanTest, PiecesAreContiguousRunsOfTheRanksArena) {
  const Layout l = GetParam();
  const model::ParameterTable whole(kSmall);
  std::vector<float> global(whole.num_params());
  for (size_t i = 0; i < global.size(); ++i) global[i] = static_cast<float>(i);
  for (const auto& [table, position] : Ranks(kSmall, l)) {
    std::vector<float> arena(table.num_params());
    for (const model::ParameterInfo& info : table.tensors()) {
      if (info.present()) {
        ExtractShard(info, global.data() + whole[info.id].offset, arena.data() + info.offset);
      }
    }
    for (const SavePiece& piece : PlanSave(table, position, 0)) {
      if (piece.kind != StateKind::kParam) continue;
      const model::ParameterInfo& info = *whole.Find(piece.tensor.substr(6));
      const Box full = WholeBox(info.global_shape);
      std::vector<int64_t> point = piece.box.start;
      for (size_t k = 0; k < piece.count; ++k) {
        const float expected = static_cast<float>(info.offset + FlatIndexIn(full, point));
        ASSERT_EQ(arena[piece.arena_offset + k], expected) << piece.tensor << " " << k;
        for (int d = piece.box.rank() - 1; d >= 0; --d) {
          if (++point[d] < piece.box.start[d] + piece.box.extent[d]) break;
          point[d] = piece.box.start[d];
        }
      }
    }
  }
}

// Loads need every weight of the shard and the moments of the optimizer
// range, nothing else.
TEST_P(ShardPlanTest, LoadPiecesCoverTheShardAndTheOptimizerRange) {
  const Layout l = GetParam();
  for (const auto& [table, position] : Ranks(kSmall, l)) {
    for (bool zero1 : {false, true}) {
      const layout::ShardRange own = layout::DataShardRange(table.num_params(), l.dp, position.coords.data);
      const ArenaRange optimizer =
          zero1 ? ArenaRange{own.begin, own.end} : ArenaRange{0, table.num_params()};
      std::map<StateKind, std::vector<char>> covered;
      for (StateKind kind : kStateKinds) covered[kind].assign(table.num_params(), 0);
      for (const LoadPiece& piece : PlanLoad(table, optimizer)) {
        for (int64_t k = 0; k < piece.count; ++k) covered[piece.kind][piece.arena_offset + k]++;
      }
      for (size_t i = 0; i < table.num_params(); ++i) {
        ASSERT_EQ(covered[StateKind::kParam][i], 1) << i;
        const char in_range = i >= optimizer.begin && i < optimizer.end ? 1 : 0;
        ASSERT_EQ(covered[StateKind::kAdamM][i], in_range) << i;
        ASSERT_EQ(covered[StateKind::kAdamV][i], in_range) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardPlanTest,
                         ::testing::Values(Layout{1, 1, 1}, Layout{2, 1, 1}, Layout{4, 1, 1},
                                           Layout{1, 2, 1}, Layout{1, 4, 1}, Layout{1, 1, 2},
                                           Layout{1, 1, 4}, Layout{2, 2, 1}, Layout{2, 1, 2},
                                           Layout{1, 2, 2}, Layout{2, 2, 2}, Layout{3, 1, 3}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return "dp" + std::to_string(info.param.dp) + "_tp" +
                                  std::to_string(info.param.tp) + "_pp" +
                                  std::to_string(info.param.pp);
                         });

TEST(ShardPlanTest, NamesAndFingerprint) {
  EXPECT_EQ(TensorName(StateKind::kAdamV, "qkvw"), "adam_v/qkvw");
  EXPECT_EQ(ModelFingerprint(kSmall),
            "layers=4 heads=4 width=128 vocab=512 padded_vocab=512 context=64");
}

}  // namespace
}  // namespace cohort::checkpoint
