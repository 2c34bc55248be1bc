#pragma once
// DeviceArena: the bookkeeping of one up-front reservation of device memory,
// carved into aligned blocks. It holds offsets only (no pointers, no CUDA),
// so the allocator a GPU backend relies on is unit-tested on machines
// without a GPU. A training session reserves its arena once, when it is
// built, so running out shows there (ResourceExhausted naming the bytes
// wanted and free) rather than in the middle of a step; and device memory
// is not returned to the driver and asked for again on every re-plan.
//
// First fit by address over a free list that coalesces with both neighbours
// on Free, so a session that frees and re-allocates same-sized buffers gets
// the same offsets back (and no fragmentation builds up across re-plans).
//
// Thread-safety: thread-compatible (the backend that owns it is).

#include <cstddef>
#include <map>
#include <optional>
#include <string>

namespace cohort::compute {

class DeviceArena {
 public:
  // CHECKs that alignment is a power of two and capacity a multiple of it.
  DeviceArena(size_t capacity, size_t alignment);

  // The offset of a block of at least `bytes` (rounded up to the alignment;
  // 0 bytes takes one aligned unit so every block has its own offset), or
  // nullopt when no free range is large enough.
  std::optional<size_t> Allocate(size_t bytes);
  // Returns the block at `offset` (an offset Allocate gave and not yet
  // freed; anything else is a programmer error, CHECKed).
  void Free(size_t offset);

  size_t capacity() const { return capacity_; }
  size_t alignment() const { return alignment_; }
  size_t used() const { return used_; }
  size_t free_bytes() const { return capacity_ - used_; }
  size_t largest_free_block() const;
  size_t blocks() const { return allocated_.size(); }
  // "N bytes wanted (R after alignment), F of C free, the largest free block
  // L": the ResourceExhausted text of a failed Allocate.
  std::string DescribeShortfall(size_t bytes) const;

 private:
  size_t RoundUp(size_t bytes) const;

  size_t capacity_;
  size_t alignment_;
  size_t used_ = 0;
  std::map<size_t, size_t> free_;       // offset -> size, disjoint, never adjacent
  std::map<size_t, size_t> allocated_;  // offset -> size
};

}  // namespace cohort::compute
