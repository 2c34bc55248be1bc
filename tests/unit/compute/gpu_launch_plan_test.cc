// The launch arithmetic of the CUDA kernels, checked where no GPU is needed:
// grids cover their problems, the column-sum plan covers every row exactly
// once in few chunks, and key widths hold their largest key.

#include "worker/compute/gpu_launch_plan.h"

#include "gtest/gtest.h"

namespace cohort::compute::gpu_plan {
namespace {

TEST(GpuLaunchPlanTest, GridStrideBlocksCoverOrCap) {
  EXPECT_EQ(GridStrideBlocks(0, 256), 1);
  EXPECT_EQ(GridStrideBlocks(1, 256), 1);
  EXPECT_EQ(GridStrideBlocks(256, 256), 1);
  EXPECT_EQ(GridStrideBlocks(257, 256), 2);
  // GPT-2 124M's largest element-wise op: B=16, T=1024, 4C=3072.
  EXPECT_EQ(GridStrideBlocks(int64_t{16} * 1024 * 3072, 256), 196608);
  EXPECT_EQ(GridStrideBlocks(int64_t{1} << 40, 256), kMaxBlocks);  // loops instead
}

TEST(GpuLaunchPlanTest, WarpRowBlocksGiveEveryRowAWarp) {
  EXPECT_EQ(WarpRowBlocks(0), 1);
  EXPECT_EQ(WarpRowBlocks(1), 1);
  EXPECT_EQ(WarpRowBlocks(kWarpsPerBlock), 1);
  EXPECT_EQ(WarpRowBlocks(kWarpsPerBlock + 1), 2);
  for (int64_t rows : {1, 7, 74, 16384, 196608}) {
    EXPECT_GE(WarpRowBlocks(rows) * kWarpsPerBlock, rows);
    EXPECT_LT((WarpRowBlocks(rows) - 1) * kWarpsPerBlock, rows);
  }
}

TEST(GpuLaunchPlanTest, ColumnReduceChunksTileTheRows) {
  EXPECT_EQ(PlanColumnReduce(0).chunks, 0);
  for (int rows : {1, 15, 16, 17, 74, 1000, 8192, 16384, 16385, 1 << 20}) {
    const ColumnReducePlan plan = PlanColumnReduce(rows);
    SCOPED_TRACE(rows);
    EXPECT_GE(plan.rows_per_chunk, kMinRowsPerChunk);
    EXPECT_LE(plan.chunks, kColumnChunksTarget);
    EXPECT_LE(plan.chunks, 65535) << "gridDim.y";
    // Every row in exactly one chunk: the last chunk starts before the end.
    EXPECT_GE(int64_t{plan.chunks} * plan.rows_per_chunk, rows);
    EXPECT_LT(int64_t{plan.chunks - 1} * plan.rows_per_chunk, rows);
  }
  // The plan depends on the row count only: the same sums in the same order.
  EXPECT_EQ(PlanColumnReduce(16384).chunks, PlanColumnReduce(16384).chunks);
}

TEST(GpuLaunchPlanTest, KeyBitsHoldTheLargestKey) {
  EXPECT_EQ(KeyBits(0), 1);
  EXPECT_EQ(KeyBits(1), 1);
  EXPECT_EQ(KeyBits(2), 2);
  EXPECT_EQ(KeyBits(50304), 16);  // GPT-2's padded vocabulary (the sentinel key)
  EXPECT_EQ(KeyBits(65535), 16);
  EXPECT_EQ(KeyBits(65536), 17);
  EXPECT_EQ(KeyBits(0xffffffffu), 32);
  for (uint32_t key : {3u, 100u, 4097u, 1u << 20}) {
    EXPECT_LT(uint64_t{key}, uint64_t{1} << KeyBits(key));
  }
}

TEST(GpuLaunchPlanTest, AlignUpKeepsScratchBuffersOnTheDeviceBoundary) {
  EXPECT_EQ(AlignUp(0), 0u);
  EXPECT_EQ(AlignUp(1), kDeviceAlignment);
  EXPECT_EQ(AlignUp(kDeviceAlignment), kDeviceAlignment);
  EXPECT_EQ(AlignUp(kDeviceAlignment + 1), 2 * kDeviceAlignment);
}

}  // namespace
}  // namespace cohort::compute::gpu_plan
