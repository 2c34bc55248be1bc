// ParamCopyLayout: the bf16 working copy's blocks (padded rows, 256-byte
// starts), the index map the kernels use (CopyIndexOf) against the padded
// column-major layout the GEMMs' per-call rounding writes, the lookup of a
// GEMM operand (Find), and the refusal of bad block lists.

#include "worker/compute/param_copy_layout.h"

#include <vector>

#include "gtest/gtest.h"

namespace cohort::compute {
namespace {

// Where CudaBackend::Operand's per-call rounding puts element (row r of the
// weight, input feature c) of a rows x row_length weight: the column-major
// row_length x rows matrix, columns padded to 8 elements.
int64_t PerCallIndex(int64_t r, int64_t c, int row_length) {
  return r * ((row_length + 7) / 8 * 8) + c;
}

TEST(ParamCopyLayoutTest, PadsRowsToEightAndStartsBlocksOn256Bytes) {
  // A 3 x 75 weight (padded rows of 80), a 2 x 16 one (no padding), a bias
  // between them that no block holds.
  absl::StatusOr<ParamCopyLayout> layout =
      ParamCopyLayout::Create(300, {{.offset = 0, .numel = 225, .row_length = 75},
                                    {.offset = 230, .numel = 32, .row_length = 16}});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->blocks().size(), 2u);
  EXPECT_EQ(layout->blocks()[0].ld, 80);
  EXPECT_EQ(layout->blocks()[0].copy_offset, 0);
  // 3 rows x 80 = 240 elements, rounded up to 256 (two units of 128).
  EXPECT_EQ(layout->blocks()[1].copy_offset, 256);
  EXPECT_EQ(layout->blocks()[1].ld, 16);
  EXPECT_EQ(layout->copy_numel(), 256u + 128u);
  for (const ParamCopyBlock& block : layout->blocks()) {
    EXPECT_EQ(block.copy_offset % kCopyAlignment, 0);
  }
}

TEST(ParamCopyLayoutTest, IndexMapIsThePerCallRoundingsLayoutOfEachBlock) {
  const std::vector<ParamBlock> blocks = {{.offset = 5, .numel = 4 * 75, .row_length = 75},
                                          {.offset = 320, .numel = 3 * 24, .row_length = 24},
                                          {.offset = 392, .numel = 2 * 9, .row_length = 9}};
  const size_t arena = 420;
  absl::StatusOr<ParamCopyLayout> layout = ParamCopyLayout::Create(arena, blocks);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<ParamCopyBlock>& copy = layout->blocks();
  std::vector<int> hits(layout->copy_numel(), 0);
  for (size_t i = 0; i < arena; ++i) {
    const int64_t at =
        CopyIndexOf(copy.data(), static_cast<int>(copy.size()), static_cast<int64_t>(i));
    int owner = -1;
    for (size_t k = 0; k < blocks.size(); ++k) {
      if (i >= blocks[k].offset && i < blocks[k].offset + blocks[k].numel) owner = k;
    }
    if (owner < 0) {
      EXPECT_EQ(at, -1) << "element " << i << " is in no block";
      continue;
    }
    const ParamBlock& block = blocks[owner];
    const int64_t local = static_cast<int64_t>(i - block.offset);
    EXPECT_EQ(
        at, copy[owner].copy_offset +
                PerCallIndex(local / block.row_length, local % block.row_length, block.row_length))
        << "element " << i;
    ASSERT_GE(at, 0);
    ASSERT_LT(at, static_cast<int64_t>(layout->copy_numel()));
    ++hits[at];
  }
  // One arena element per copy element at most: no two share a place.
  for (int count : hits) EXPECT_LE(count, 1);
}

TEST(ParamCopyLayoutTest, FindsOperandsThatAreWholeRowsOfOneBlock) {
  absl::StatusOr<ParamCopyLayout> layout =
      ParamCopyLayout::Create(1000, {{.offset = 100, .numel = 6 * 75, .row_length = 75},
                                     {.offset = 600, .numel = 4 * 32, .row_length = 32}});
  ASSERT_TRUE(layout.ok()) << layout.status();
  // The whole first block: a 75 x 6 column-major operand with ld 75.
  std::optional<ParamCopyView> whole = layout->Find(100, 75, 6, 75);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->copy_offset, 0);
  EXPECT_EQ(whole->ld, 80);
  // Rows 2..3 of it (a tensor-parallel slice of output features).
  std::optional<ParamCopyView> part = layout->Find(100 + 2 * 75, 75, 2, 75);
  ASSERT_TRUE(part.has_value());
  EXPECT_EQ(part->copy_offset, 2 * 80);
  // The second block starts on the next 128-element boundary after 480.
  std::optional<ParamCopyView> second = layout->Find(600, 32, 4, 32);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->copy_offset, 512);
  EXPECT_EQ(second->ld, 32);
  // Not whole rows of one block: the caller rounds per call.
  EXPECT_FALSE(layout->Find(100, 74, 6, 75).has_value());       // another height
  EXPECT_FALSE(layout->Find(100, 75, 6, 80).has_value());       // another stride
  EXPECT_FALSE(layout->Find(101, 75, 5, 75).has_value());       // not on a row boundary
  EXPECT_FALSE(layout->Find(100 + 75, 75, 6, 75).has_value());  // runs past the block
  EXPECT_FALSE(layout->Find(50, 75, 1, 75).has_value());        // before every block
  EXPECT_FALSE(layout->Find(560, 32, 1, 32).has_value());       // between blocks
  EXPECT_FALSE(layout->Find(100, 75, 0, 75).has_value());       // no columns
}

TEST(ParamCopyLayoutTest, RefusesBadBlockLists) {
  auto refused = [](size_t arena, std::vector<ParamBlock> blocks) {
    absl::StatusOr<ParamCopyLayout> layout = ParamCopyLayout::Create(arena, blocks);
    return !layout.ok() && absl::IsInvalidArgument(layout.status());
  };
  EXPECT_TRUE(refused(100, {{.offset = 0, .numel = 10, .row_length = 3}}));  // 3 does not divide 10
  EXPECT_TRUE(refused(100, {{.offset = 0, .numel = 10, .row_length = 0}}));  // no rows
  EXPECT_TRUE(refused(100, {{.offset = 0, .numel = 0, .row_length = 1}}));   // empty
  EXPECT_TRUE(refused(100, {{.offset = 95, .numel = 10, .row_length = 5}}));  // past the arena
  EXPECT_TRUE(refused(100, {{.offset = 20, .numel = 10, .row_length = 5},
                            {.offset = 0, .numel = 10, .row_length = 5}}));  // descending
  EXPECT_TRUE(refused(100, {{.offset = 0, .numel = 10, .row_length = 5},
                            {.offset = 5, .numel = 10, .row_length = 5}}));  // overlapping
  absl::StatusOr<ParamCopyLayout> none = ParamCopyLayout::Create(100, {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->copy_numel(), 0u);
  EXPECT_EQ(CopyIndexOf(none->blocks().data(), 0, 7), -1);
}

}  // namespace
}  // namespace cohort::compute
