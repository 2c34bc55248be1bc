#include "common/box.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace cohort {
namespace {

int64_t Product(absl::Span<const int64_t> values, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < values.size(); ++i) p *= values[i];
  return p;
}

// Appends the boxes of flat [begin, end) of `shape`, with the dimensions
// before `shape` fixed at `prefix` (extent 1).
void Decompose(absl::Span<const int64_t> shape, std::vector<int64_t>& prefix, int64_t begin,
               int64_t end, std::vector<Box>& out) {
  if (begin >= end) return;
  const size_t fixed = prefix.size();
  auto emit = [&](int64_t lo, int64_t hi) {  // rows [lo, hi) of dim 0 of `shape`, full below
    Box box;
    box.start = prefix;
    box.extent.assign(fixed, 1);
    box.start.push_back(lo);
    box.extent.push_back(hi - lo);
    for (size_t d = 1; d < shape.size(); ++d) {
      box.start.push_back(0);
      box.extent.push_back(shape[d]);
    }
    out.push_back(std::move(box));
  };
  if (shape.size() == 1) {
    emit(begin, end);
    return;
  }
  const int64_t row = Product(shape, 1);  // elements per index of dim 0
  int64_t first_row = begin / row;
  const int64_t last_row = (end - 1) / row;
  auto recurse_in_row = [&](int64_t r, int64_t lo, int64_t hi) {
    prefix.push_back(r);
    Decompose(shape.subspan(1), prefix, lo, hi, out);
    prefix.pop_back();
  };
  if (first_row == last_row) {
    if (begin % row == 0 && end % row == 0) {
      emit(first_row, first_row + 1);
    } else {
      recurse_in_row(first_row, begin - first_row * row, end - first_row * row);
    }
    return;
  }
  if (begin % row != 0) {
    recurse_in_row(first_row, begin % row, row);
    ++first_row;
  }
  const int64_t full_end = end / row;  // rows [first_row, full_end) are whole
  if (full_end > first_row) emit(first_row, full_end);
  if (end % row != 0) recurse_in_row(full_end, 0, end % row);
}

// Splits a box of the shape Decompose makes (extent 1 up to some dimension
// k, a range on k, whole dimensions of `shape` after it) into pieces of at
// most `max` elements that keep that shape, so each stays a contiguous run.
void Split(const Box& box, int64_t max, std::vector<Box>& out) {
  if (box.NumElements() <= max) {
    out.push_back(box);
    return;
  }
  int k = 0;
  while (k < box.rank() - 1 && box.extent[k] == 1) ++k;
  const int64_t inner = Product(box.extent, k + 1);
  const int64_t rows_per_piece = std::max<int64_t>(1, max / inner);
  for (int64_t r = 0; r < box.extent[k]; r += rows_per_piece) {
    Box piece = box;
    piece.start[k] = box.start[k] + r;
    piece.extent[k] = std::min(rows_per_piece, box.extent[k] - r);
    if (piece.NumElements() > max) {
      Split(piece, max, out);  // one row too big: split the next dimension
    } else {
      out.push_back(std::move(piece));
    }
  }
}

}  // namespace

int64_t Box::NumElements() const { return Product(extent); }

std::string BoxToString(const Box& box) {
  // Error messages print boxes as received, which may be malformed: start
  // and extent of different lengths, or an end past INT64_MAX.
  if (box.start.size() != box.extent.size()) {
    return absl::StrCat("start [", absl::StrJoin(box.start, ", "), "] extent [",
                        absl::StrJoin(box.extent, ", "), "]");
  }
  std::vector<std::string> dims;
  for (int d = 0; d < box.rank(); ++d) {
    int64_t end;
    if (__builtin_add_overflow(box.start[d], box.extent[d], &end)) {
      dims.push_back(absl::StrCat(box.start[d], ":", box.start[d], "+", box.extent[d]));
    } else {
      dims.push_back(absl::StrCat(box.start[d], ":", end));
    }
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

Box WholeBox(absl::Span<const int64_t> shape) {
  return Box{std::vector<int64_t>(shape.size(), 0), std::vector<int64_t>(shape.begin(), shape.end())};
}

bool BoxWithin(const Box& box, absl::Span<const int64_t> shape) {
  if (box.start.size() != shape.size() || box.extent.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.start[d] < 0 || box.extent[d] < 0 || box.start[d] > shape[d] ||
        box.extent[d] > shape[d] - box.start[d]) {
      return false;
    }
  }
  return true;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  CHECK(a.rank() == b.rank()) << BoxToString(a) << " vs " << BoxToString(b);
  Box out;
  for (int d = 0; d < a.rank(); ++d) {
    const int64_t lo = std::max(a.start[d], b.start[d]);
    const int64_t hi = std::min(a.start[d] + a.extent[d], b.start[d] + b.extent[d]);
    if (hi <= lo) return std::nullopt;
    out.start.push_back(lo);
    out.extent.push_back(hi - lo);
  }
  return out;
}

Box Translate(const Box& box, absl::Span<const int64_t> offset) {
  CHECK(static_cast<size_t>(box.rank()) == offset.size());
  Box out = box;
  for (int d = 0; d < box.rank(); ++d) out.start[d] += offset[d];
  return out;
}

std::vector<Box> FlatRangeToBoxes(absl::Span<const int64_t> shape, int64_t begin, int64_t end,
                                  int64_t max_elements) {
  CHECK(0 <= begin && begin <= end && end <= Product(shape))
      << "flat range [" << begin << ", " << end << ") of " << Product(shape) << " elements";
  std::vector<Box> boxes;
  if (shape.empty()) {
    if (begin < end) boxes.push_back(Box{});
    return boxes;
  }
  std::vector<int64_t> prefix;
  Decompose(shape, prefix, begin, end, boxes);
  if (max_elements <= 0) return boxes;
  std::vector<Box> limited;
  for (const Box& box : boxes) Split(box, max_elements, limited);
  return limited;
}

int64_t FlatIndexIn(const Box& box, absl::Span<const int64_t> point) {
  int64_t index = 0;
  for (int d = 0; d < box.rank(); ++d) index = index * box.extent[d] + (point[d] - box.start[d]);
  return index;
}

bool IsContiguousIn(const Box& region, const Box& box) {
  int d = 0;
  while (d < region.rank() && region.extent[d] == 1) ++d;
  for (++d; d < region.rank(); ++d) {
    if (region.extent[d] != box.extent[d]) return false;
  }
  return true;
}

void CopyRegion(const Box& region, const ConstBoxedBuffer& src, const BoxedBuffer& dst,
                size_t element_bytes) {
  const int rank = region.rank();
  if (region.empty()) return;
  if (rank == 0) {
    std::memcpy(dst.data, src.data, element_bytes);
    return;
  }
  // Trailing dimensions the region spans whole in both boxes are one run.
  int merged_from = rank - 1;
  while (merged_from > 0 && region.extent[merged_from] == src.box->extent[merged_from] &&
         region.extent[merged_from] == dst.box->extent[merged_from]) {
    --merged_from;
  }
  const int64_t run = Product(region.extent, merged_from);
  const size_t run_bytes = static_cast<size_t>(run) * element_bytes;
  std::vector<int64_t> point = region.start;
  const auto* from = static_cast<const char*>(src.data);
  auto* to = static_cast<char*>(dst.data);
  for (;;) {
    const int64_t s = FlatIndexIn(*src.box, point) - src.first;
    const int64_t t = FlatIndexIn(*dst.box, point) - dst.first;
    std::memcpy(to + static_cast<size_t>(t) * element_bytes,
                from + static_cast<size_t>(s) * element_bytes, run_bytes);
    // Odometer over the dimensions before merged_from.
    int d = merged_from - 1;
    while (d >= 0) {
      if (++point[d] < region.start[d] + region.extent[d]) break;
      point[d] = region.start[d];
      --d;
    }
    if (d < 0) return;
  }
}

}  // namespace cohort
