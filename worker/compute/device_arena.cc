#include "worker/compute/device_arena.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::compute {

DeviceArena::DeviceArena(size_t capacity, size_t alignment)
    : capacity_(capacity), alignment_(alignment) {
  CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0)
      << "arena alignment must be a power of two, got " << alignment;
  CHECK(capacity % alignment == 0)
      << "arena capacity " << capacity << " is not a multiple of its alignment " << alignment;
  if (capacity > 0) free_.emplace(0, capacity);
}

size_t DeviceArena::RoundUp(size_t bytes) const {
  const size_t wanted = std::max<size_t>(bytes, 1);
  // A request within one alignment unit of SIZE_MAX cannot be rounded; it
  // cannot fit either, so it maps to a size no arena has.
  if (wanted > SIZE_MAX - alignment_) return SIZE_MAX;
  return (wanted + alignment_ - 1) & ~(alignment_ - 1);
}

std::optional<size_t> DeviceArena::Allocate(size_t bytes) {
  const size_t size = RoundUp(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const size_t offset = it->first;
    const size_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + size, rest);
    allocated_.emplace(offset, size);
    used_ += size;
    return offset;
  }
  return std::nullopt;
}

void DeviceArena::Free(size_t offset) {
  auto block = allocated_.find(offset);
  CHECK(block != allocated_.end()) << "arena: no block at offset " << offset;
  size_t begin = block->first;
  size_t size = block->second;
  used_ -= size;
  allocated_.erase(block);
  // Merge with the free range that ends where this block begins, and with
  // the one that begins where it ends.
  auto next = free_.lower_bound(begin);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && begin + size == next->first) {
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(begin, size);
}

size_t DeviceArena::largest_free_block() const {
  size_t largest = 0;
  for (const auto& [offset, size] : free_) largest = std::max(largest, size);
  return largest;
}

std::string DeviceArena::DescribeShortfall(size_t bytes) const {
  return absl::StrCat(bytes, " bytes wanted (", RoundUp(bytes), " after alignment), ", free_bytes(),
                      " of ", capacity_, " free, the largest free block ", largest_free_block());
}

}  // namespace cohort::compute
