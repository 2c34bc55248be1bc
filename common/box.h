#pragma once
// Box: a rectangular region of a row-major tensor (start and extent per
// dimension), and the shard arithmetic checkpoints are made of: intersecting
// boxes, cutting a flat element range into boxes, and copying the overlap of
// two differently laid out buffers.
//
// A buffer "laid out over" a box holds that box's elements in row-major
// order; it may hold only a contiguous part of them, starting at flat index
// `first` within the box (a ZeRO-1 shard of optimizer state, say).
//
// Thread-safety: plain data and pure functions.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace cohort {

struct Box {
  std::vector<int64_t> start;
  std::vector<int64_t> extent;

  int rank() const { return static_cast<int>(extent.size()); }
  // Product of the extents (1 for a rank-0 box).
  int64_t NumElements() const;
  bool empty() const { return NumElements() == 0; }

  friend bool operator==(const Box&, const Box&) = default;
};

// "[0:4, 8:16]": start:end per dimension. A malformed box (start and extent
// of different lengths) prints as "start [..] extent [..]", and an end past
// INT64_MAX as "s:s+e", so refusal messages never read out of bounds.
std::string BoxToString(const Box& box);

// The whole of a tensor of `shape`.
Box WholeBox(absl::Span<const int64_t> shape);

// Whether `box` has the rank of `shape`, non-negative starts and extents,
// and lies inside it.
bool BoxWithin(const Box& box, absl::Span<const int64_t> shape);

// The overlap of `a` and `b` (same rank), or nullopt when it is empty.
std::optional<Box> Intersect(const Box& a, const Box& b);

// `box` moved by `offset` per dimension (same rank).
Box Translate(const Box& box, absl::Span<const int64_t> offset);

// The boxes covering exactly the row-major flat elements [begin, end) of a
// tensor of `shape`, in flat order, each at most `max_elements` elements
// (0: no limit). Each box is one contiguous run of flat indices, so a buffer
// of [begin, end) holds each box's elements back to back in row-major order.
// Without a limit there are at most 2 * rank - 1 boxes.
// Requires 0 <= begin <= end <= product(shape).
std::vector<Box> FlatRangeToBoxes(absl::Span<const int64_t> shape, int64_t begin, int64_t end,
                                  int64_t max_elements = 0);

// Row-major flat index of `point` (absolute coordinates) within `box`.
int64_t FlatIndexIn(const Box& box, absl::Span<const int64_t> point);

// Whether the elements of `region` (inside `box`) are one run of consecutive
// row-major flat indices of `box`: each dimension before the first one
// where region is longer than 1 has extent 1, and each after it spans the
// box whole. The run starts at FlatIndexIn(box, region.start).
bool IsContiguousIn(const Box& region, const Box& box);

// A buffer laid out over `box`, holding its flat elements from `first` on.
struct BoxedBuffer {
  const Box* box = nullptr;
  int64_t first = 0;
  void* data = nullptr;
};
struct ConstBoxedBuffer {
  const Box* box = nullptr;
  int64_t first = 0;
  const void* data = nullptr;
};

// Copies the elements of `region` (absolute coordinates, inside both boxes,
// and inside the parts the buffers hold) from `src` to `dst`.
void CopyRegion(const Box& region, const ConstBoxedBuffer& src, const BoxedBuffer& dst,
                size_t element_bytes);

}  // namespace cohort
