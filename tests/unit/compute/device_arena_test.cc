// DeviceArena: first fit, alignment, coalescing on free, exhaustion, and
// the shortfall message the CUDA backend's ResourceExhausted carries.

#include "worker/compute/device_arena.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace cohort::compute {
namespace {

TEST(DeviceArenaTest, AllocatesAlignedBlocksInAddressOrder) {
  DeviceArena arena(4096, 256);
  EXPECT_EQ(arena.Allocate(1), 0u);
  EXPECT_EQ(arena.Allocate(256), 256u);
  EXPECT_EQ(arena.Allocate(257), 512u);  // two units
  EXPECT_EQ(arena.Allocate(0), 1024u);   // zero bytes still take a unit of their own
  EXPECT_EQ(arena.used(), 1280u);
  EXPECT_EQ(arena.blocks(), 4u);
  EXPECT_EQ(arena.free_bytes(), 4096u - 1280u);
}

TEST(DeviceArenaTest, RefusesWhatDoesNotFitAndSaysWhy) {
  DeviceArena arena(1024, 256);
  ASSERT_EQ(arena.Allocate(512), 0u);
  ASSERT_EQ(arena.Allocate(256), 512u);
  EXPECT_FALSE(arena.Allocate(512).has_value());  // 256 free
  EXPECT_FALSE(arena.Allocate(SIZE_MAX).has_value());
  EXPECT_EQ(arena.DescribeShortfall(300),
            "300 bytes wanted (512 after alignment), 256 of 1024 free, the largest free block 256");
  // A refused request changes nothing.
  EXPECT_EQ(arena.used(), 768u);
  EXPECT_EQ(arena.Allocate(256), 768u);
}

TEST(DeviceArenaTest, FreeCoalescesWithBothNeighbours) {
  DeviceArena arena(1024, 256);
  const size_t a = *arena.Allocate(256), b = *arena.Allocate(256), c = *arena.Allocate(256);
  ASSERT_TRUE(arena.Allocate(256).has_value());
  arena.Free(a);
  arena.Free(c);
  EXPECT_EQ(arena.largest_free_block(), 256u);  // a and c are not adjacent
  EXPECT_FALSE(arena.Allocate(768).has_value());
  arena.Free(b);  // joins a, b and c
  EXPECT_EQ(arena.largest_free_block(), 768u);
  EXPECT_EQ(arena.Allocate(768), 0u);
}

TEST(DeviceArenaTest, SameSizesComeBackAtTheSameOffsets) {
  // A session rebuilt after a re-plan frees and re-allocates its buffers in
  // the same order: it gets the same layout, with no fragmentation growing.
  DeviceArena arena(1 << 20, 256);
  const std::vector<size_t> sizes = {1000, 70000, 256, 3, 123456, 4096};
  std::vector<size_t> first;
  for (size_t size : sizes) first.push_back(*arena.Allocate(size));
  for (int round = 0; round < 5; ++round) {
    for (size_t offset : first) arena.Free(offset);
    EXPECT_EQ(arena.used(), 0u);
    EXPECT_EQ(arena.largest_free_block(), size_t{1} << 20);
    std::vector<size_t> again;
    for (size_t size : sizes) again.push_back(*arena.Allocate(size));
    EXPECT_EQ(again, first) << "round " << round;
  }
}

TEST(DeviceArenaTest, RandomAllocateAndFreeKeepsTheBooksStraight) {
  DeviceArena arena(size_t{1} << 16, 64);
  std::mt19937_64 rng(5);
  std::vector<std::pair<size_t, size_t>> live;  // offset, rounded size
  for (int i = 0; i < 2000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const size_t bytes = 1 + rng() % 3000;
      const std::optional<size_t> offset = arena.Allocate(bytes);
      if (!offset.has_value()) continue;
      const size_t rounded = (bytes + 63) / 64 * 64;
      ASSERT_EQ(*offset % 64, 0u);
      ASSERT_LE(*offset + rounded, arena.capacity());
      for (const auto& [o, s] : live) {
        ASSERT_TRUE(*offset + rounded <= o || o + s <= *offset) << "overlapping blocks";
      }
      live.emplace_back(*offset, rounded);
    } else {
      const size_t pick = rng() % live.size();
      arena.Free(live[pick].first);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    size_t used = 0;
    for (const auto& block : live) used += block.second;
    ASSERT_EQ(arena.used(), used);
  }
  for (const auto& block : live) arena.Free(block.first);
  EXPECT_EQ(arena.largest_free_block(), arena.capacity());
}

TEST(DeviceArenaDeathTest, FreeingAnUnknownOffsetIsAProgrammerError) {
  DeviceArena arena(1024, 256);
  ASSERT_EQ(arena.Allocate(10), 0u);
  EXPECT_DEATH(arena.Free(256), "no block at offset 256");
}

}  // namespace
}  // namespace cohort::compute
