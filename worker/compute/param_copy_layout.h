#pragma once
// ParamCopyLayout: where each weight of the fp32 parameter arena lives in a
// backend's bf16 working copy (Backend::AttachParams), and the index map
// between the two. Plain host code plus one COHORT_HOST_DEVICE lookup, so the
// map the CUDA kernels use (the copy's refresh, ClipAdamW's fused write) runs
// in the CPU tests too (tests/unit/compute/param_copy_layout_test.cc).
//
// Why a padded layout rather than a bf16 mirror at the same indices: a GEMM
// reads a weight (OC, C) row-major as the column-major C x OC matrix with
// leading dimension C, and the bf16 GEMMs want every column on 16 bytes (a
// multiple of 8 elements; CudaBackend::Operand pads the per-call rounding
// the same way), and each matrix's start on 256 bytes (what cuBLASLt assumes
// unless told otherwise). So each block of the arena that a GEMM reads as a
// matrix (one layer's slice of a weight) gets its own place in the copy:
// rows (of C elements) at a stride of C rounded up to 8, the block starting
// on 128 elements (256 bytes). A GEMM over the copy then sees exactly the
// operand the per-call rounding produced (same bits, same leading dimension,
// same alignment), so it picks the same algorithm and gives the same bits.
// Elements outside every block (biases, LayerNorm) have no copy: no GEMM
// reads them.
//
// Thread-safety: immutable after Create; safe to share.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/host_device.h"

namespace cohort::compute {

// A block of the parameter arena that GEMMs read as a matrix: `numel`
// elements from flat element `offset`, rows of `row_length` elements
// (row-major; a weight (OC, C) has row_length C and numel OC * C).
struct ParamBlock {
  size_t offset = 0;
  size_t numel = 0;
  int row_length = 0;
};

// One block as the kernels see it (plain data, copied to the device).
struct ParamCopyBlock {
  int64_t offset = 0;       // first element in the fp32 arena
  int64_t numel = 0;        // elements in the arena
  int64_t copy_offset = 0;  // first element in the bf16 copy (a multiple of kCopyAlignment)
  int32_t row_length = 0;   // elements per row in the arena
  int32_t ld = 0;           // elements per row in the copy: row_length rounded up to 8
};

// A GEMM operand's place in the copy: its first element and its leading
// dimension there.
struct ParamCopyView {
  int64_t copy_offset = 0;
  int ld = 0;
};

// The copy's block starts, in bf16 elements (256 bytes).
inline constexpr int64_t kCopyAlignment = 128;
// A copy row's stride: a multiple of 8 elements (16 bytes).
COHORT_HOST_DEVICE int32_t CopyRowStride(int32_t row_length) { return (row_length + 7) / 8 * 8; }

// The last of the `count` ascending `blocks` starting at or before arena
// element `i`, or -1 when none does (a binary search).
COHORT_HOST_DEVICE int BlockAtOrBefore(const ParamCopyBlock* blocks, int count, int64_t i) {
  int low = 0, high = count;  // the first block starting after i is in [low, high]
  while (low < high) {
    const int mid = low + (high - low) / 2;
    if (blocks[mid].offset <= i) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low - 1;
}

// The copy element of arena element `i`, or -1 when no block holds it.
// `blocks` are ascending and disjoint (ParamCopyLayout's).
COHORT_HOST_DEVICE int64_t CopyIndexOf(const ParamCopyBlock* blocks, int count, int64_t i) {
  const int k = BlockAtOrBefore(blocks, count, i);
  if (k < 0) return -1;
  const ParamCopyBlock& block = blocks[k];
  const int64_t local = i - block.offset;
  if (local >= block.numel) return -1;
  return block.copy_offset + local / block.row_length * block.ld + local % block.row_length;
}

class ParamCopyLayout {
 public:
  // The layout of `blocks` in an arena of `arena_numel` elements.
  // InvalidArgument naming the block when they are not ascending and
  // disjoint, leave the arena, have a row_length < 1 or one that does not
  // divide their numel.
  static absl::StatusOr<ParamCopyLayout> Create(size_t arena_numel,
                                                const std::vector<ParamBlock>& blocks);

  const std::vector<ParamCopyBlock>& blocks() const { return blocks_; }
  // Elements of the copy (padding included; the padding stays zero).
  size_t copy_numel() const { return copy_numel_; }
  // The copy of a GEMM operand read from arena element `offset` as a
  // column-major `rows` x `cols` matrix with leading dimension `ld`: found
  // when it is whole rows of one block (rows == ld == the block's
  // row_length, starting on a row boundary, ending inside the block);
  // nullopt otherwise (the caller rounds the operand itself).
  std::optional<ParamCopyView> Find(size_t offset, int rows, int64_t cols, int ld) const;

 private:
  std::vector<ParamCopyBlock> blocks_;
  size_t copy_numel_ = 0;
};

}  // namespace cohort::compute
