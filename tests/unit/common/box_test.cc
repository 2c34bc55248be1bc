#include "common/box.h"

#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort {
namespace {

int64_t Product(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

TEST(BoxTest, IntersectAndWithin) {
  const Box a{{0, 2}, {4, 4}};
  const Box b{{2, 0}, {4, 3}};
  const std::optional<Box> i = Intersect(a, b);
  ASSERT_TRUE(i.has_value());
  EXPECT_EQ(*i, (Box{{2, 2}, {2, 1}}));
  EXPECT_FALSE(Intersect(a, Box{{4, 0}, {1, 8}}).has_value());  // touching is empty
  EXPECT_TRUE(BoxWithin(a, std::vector<int64_t>{4, 6}));
  EXPECT_FALSE(BoxWithin(a, std::vector<int64_t>{4, 5}));
  EXPECT_FALSE(BoxWithin(a, std::vector<int64_t>{4}));
  EXPECT_FALSE(BoxWithin(Box{{-1, 0}, {1, 1}}, std::vector<int64_t>{4, 4}));
  EXPECT_EQ(BoxToString(a), "[0:4, 2:6]");
}

TEST(BoxTest, FlatRangeOfAFewShapes) {
  // Rows 1..2 of a (4, 3) matrix, from element 4 to 9: the tail of row 1,
  // row 2 whole, the head of row 3.
  EXPECT_THAT(FlatRangeToBoxes(std::vector<int64_t>{4, 3}, 4, 10),
              ::testing::ElementsAre(Box{{1, 1}, {1, 2}}, Box{{2, 0}, {1, 3}},
                                     Box{{3, 0}, {1, 1}}));
  EXPECT_THAT(FlatRangeToBoxes(std::vector<int64_t>{4, 3}, 0, 12),
              ::testing::ElementsAre(Box{{0, 0}, {4, 3}}));
  EXPECT_TRUE(FlatRangeToBoxes(std::vector<int64_t>{4, 3}, 5, 5).empty());
  EXPECT_THAT(FlatRangeToBoxes(std::vector<int64_t>{}, 0, 1), ::testing::ElementsAre(Box{}));
}

// Every decomposition covers its range exactly, in order, each box one
// contiguous run, within the size limit, and with at most 2 * rank - 1 boxes
// when unlimited.
TEST(BoxTest, FlatRangeToBoxesCoversRandomRangesExactlyInContiguousRuns) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    std::vector<int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 5));
    const int64_t n = Product(shape);
    int64_t begin = static_cast<int64_t>(rng() % (n + 1));
    int64_t end = static_cast<int64_t>(rng() % (n + 1));
    if (begin > end) std::swap(begin, end);
    const int64_t max = trial % 2 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 7);
    const std::vector<Box> boxes = FlatRangeToBoxes(shape, begin, end, max);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " [" << begin << ", " << end
                                      << ") max " << max);
    if (max == 0) {
      EXPECT_LE(boxes.size(), static_cast<size_t>(std::max(1, 2 * rank - 1)));
    }
    const Box whole = WholeBox(shape);
    int64_t next = begin;
    for (const Box& box : boxes) {
      ASSERT_TRUE(BoxWithin(box, shape)) << BoxToString(box);
      ASSERT_FALSE(box.empty());
      if (max > 0) {
        EXPECT_LE(box.NumElements(), max);
      }
      // Walk the box in row-major order: flat indices must be next, next+1, ...
      std::vector<int64_t> point = box.start;
      for (int64_t k = 0; k < box.NumElements(); ++k) {
        ASSERT_EQ(FlatIndexIn(whole, point), next) << BoxToString(box);
        ++next;
        for (int d = rank - 1; d >= 0; --d) {
          if (++point[d] < box.start[d] + box.extent[d]) break;
          point[d] = box.start[d];
        }
      }
    }
    EXPECT_EQ(next, end);
  }
}

// CopyRegion against an element-by-element copy, between buffers over
// different boxes holding different parts of them.
// Against brute force: the region's points, visited in row-major order,
// have consecutive flat indices in the box exactly when IsContiguousIn says.
TEST(BoxTest, IsContiguousInMatchesConsecutiveFlatIndices) {
  std::mt19937 rng(21);
  int contiguous = 0, scattered = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    Box box;
    for (int d = 0; d < rank; ++d) {
      box.start.push_back(static_cast<int64_t>(rng() % 3));
      box.extent.push_back(1 + static_cast<int64_t>(rng() % 4));
    }
    Box region;
    for (int d = 0; d < rank; ++d) {
      const int64_t lo = static_cast<int64_t>(rng() % box.extent[d]);
      const int64_t len = 1 + static_cast<int64_t>(rng() % (box.extent[d] - lo));
      region.start.push_back(box.start[d] + lo);
      region.extent.push_back(rng() % 3 == 0 ? box.extent[d] - lo : len);
    }
    bool consecutive = true;
    std::vector<int64_t> point = region.start;
    int64_t expected = FlatIndexIn(box, point);
    for (int64_t k = 0; k < region.NumElements(); ++k, ++expected) {
      consecutive = consecutive && FlatIndexIn(box, point) == expected;
      for (int d = rank - 1; d >= 0; --d) {
        if (++point[d] < region.start[d] + region.extent[d]) break;
        point[d] = region.start[d];
      }
    }
    ASSERT_EQ(IsContiguousIn(region, box), consecutive)
        << "region " << BoxToString(region) << " in box " << BoxToString(box);
    (consecutive ? contiguous : scattered)++;
  }
  // Both answers occur often enough for the comparison to mean something.
  EXPECT_GT(contiguous, 200);
  EXPECT_GT(scattered, 200);
}

TEST(BoxTest, CopyRegionMatchesElementwiseCopy) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 500; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 3);
    std::vector<int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(2 + static_cast<int64_t>(rng() % 5));
    auto random_box = [&] {
      Box b;
      for (int d = 0; d < rank; ++d) {
        const int64_t lo = static_cast<int64_t>(rng() % shape[d]);
        const int64_t hi = lo + 1 + static_cast<int64_t>(rng() % (shape[d] - lo));
        b.start.push_back(lo);
        b.extent.push_back(hi - lo);
      }
      return b;
    };
    const Box src_box = random_box();
    const Box dst_box = trial % 3 == 0 ? src_box : random_box();
    const std::optional<Box> region = Intersect(src_box, dst_box);
    if (!region) continue;
    // Global value of a point: its flat index in the whole tensor.
    const Box whole = WholeBox(shape);
    std::vector<int32_t> src(src_box.NumElements());
    std::vector<int64_t> point = src_box.start;
    for (size_t k = 0; k < src.size(); ++k) {
      src[k] = static_cast<int32_t>(FlatIndexIn(whole, point));
      for (int d = rank - 1; d >= 0; --d) {
        if (++point[d] < src_box.start[d] + src_box.extent[d]) break;
        point[d] = src_box.start[d];
      }
    }
    // The destination buffer holds dst_box's elements from `first` on.
    const int64_t first = trial % 2 == 0 ? 0 : FlatIndexIn(dst_box, region->start);
    std::vector<int32_t> dst(dst_box.NumElements() - first, -1);
    CopyRegion(*region, ConstBoxedBuffer{&src_box, 0, src.data()},
               BoxedBuffer{&dst_box, first, dst.data()}, sizeof(int32_t));
    point = dst_box.start;
    for (int64_t k = 0; k < dst_box.NumElements(); ++k) {
      bool inside = true;
      for (int d = 0; d < rank; ++d) {
        inside = inside && point[d] >= region->start[d] &&
                 point[d] < region->start[d] + region->extent[d];
      }
      if (k >= first) {
        const int32_t expected = inside ? static_cast<int32_t>(FlatIndexIn(whole, point)) : -1;
        ASSERT_EQ(dst[k - first], expected) << "trial " << trial << " element " << k;
      }
      for (int d = rank - 1; d >= 0; --d) {
        if (++point[d] < dst_box.start[d] + dst_box.extent[d]) break;
        point[d] = dst_box.start[d];
      }
    }
  }
}

}  // namespace
}  // namespace cohort
