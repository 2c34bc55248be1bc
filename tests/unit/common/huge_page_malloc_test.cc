#include "common/huge_page_malloc.h"

#include "gtest/gtest.h"

namespace cohort {
namespace {

constexpr char kMadvise[] = "always [madvise] never";

TEST(HugePageMallocTest, AddsTheTunableWhereTheKernelHasHugePagesToGive) {
  EXPECT_EQ(HugePageTunables(nullptr, nullptr, kMadvise), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(HugePageTunables("", nullptr, "[always] madvise never"), "glibc.malloc.hugetlb=1");
  // The operator's other tunables are kept.
  EXPECT_EQ(HugePageTunables("glibc.malloc.arena_max=2", nullptr, kMadvise),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
}

TEST(HugePageMallocTest, LeavesTheProcessAloneOtherwise) {
  // Already re-executed, or the operator chose a value (0 too).
  EXPECT_EQ(HugePageTunables("glibc.malloc.hugetlb=1", nullptr, kMadvise), std::nullopt);
  EXPECT_EQ(HugePageTunables("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0", nullptr, kMadvise),
            std::nullopt);
  EXPECT_EQ(HugePageTunables(nullptr, "0", kMadvise), std::nullopt);  // opted out
  EXPECT_EQ(HugePageTunables(nullptr, "1", kMadvise), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(HugePageTunables(nullptr, nullptr, "always madvise [never]"), std::nullopt);
  EXPECT_EQ(HugePageTunables(nullptr, nullptr, ""), std::nullopt);  // no THP in this kernel
}

TEST(HugePageMallocTest, TunableIsSetMatchesWholeNamesOnly) {
  EXPECT_FALSE(TunableIsSet(nullptr, "glibc.malloc.arena_max"));
  EXPECT_FALSE(TunableIsSet("", "glibc.malloc.arena_max"));
  EXPECT_TRUE(TunableIsSet("glibc.malloc.arena_max=4", "glibc.malloc.arena_max"));
  EXPECT_TRUE(TunableIsSet("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=4",
                           "glibc.malloc.arena_max"));
  EXPECT_FALSE(TunableIsSet("glibc.malloc.arena_test=4", "glibc.malloc.arena_max"));
  EXPECT_FALSE(TunableIsSet("glibc.malloc.arena_maximum=4", "glibc.malloc.arena_max"));
}

}  // namespace
}  // namespace cohort
