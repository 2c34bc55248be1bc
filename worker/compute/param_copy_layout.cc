#include "worker/compute/param_copy_layout.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace cohort::compute {

absl::StatusOr<ParamCopyLayout> ParamCopyLayout::Create(size_t arena_numel,
                                                        const std::vector<ParamBlock>& blocks) {
  ParamCopyLayout layout;
  layout.blocks_.reserve(blocks.size());
  size_t previous_end = 0;
  int64_t next = 0;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const ParamBlock& block = blocks[k];
    const std::string name =
        absl::StrCat("parameter block ", k, " (offset ", block.offset, ", numel ", block.numel,
                     ", row_length ", block.row_length, ")");
    if (block.row_length < 1 || block.numel % static_cast<size_t>(block.row_length) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": row_length must be >= 1 and divide numel"));
    }
    if (block.numel == 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": empty"));
    }
    if (block.offset < previous_end) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": blocks must be ascending and disjoint"));
    }
    if (block.offset > arena_numel || block.numel > arena_numel - block.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": outside the arena of ", arena_numel, " elements"));
    }
    if (block.numel > static_cast<size_t>(std::numeric_limits<int64_t>::max() / 2)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": too large"));
    }
    previous_end = block.offset + block.numel;
    const int32_t ld = CopyRowStride(block.row_length);
    const auto rows = static_cast<int64_t>(block.numel / block.row_length);
    layout.blocks_.push_back(ParamCopyBlock{.offset = static_cast<int64_t>(block.offset),
                                            .numel = static_cast<int64_t>(block.numel),
                                            .copy_offset = next,
                                            .row_length = block.row_length,
                                            .ld = ld});
    next += (rows * ld + kCopyAlignment - 1) / kCopyAlignment * kCopyAlignment;
  }
  layout.copy_numel_ = static_cast<size_t>(next);
  return layout;
}

std::optional<ParamCopyView> ParamCopyLayout::Find(size_t offset, int rows, int64_t cols,
                                                   int ld) const {
  const auto at = static_cast<int64_t>(offset);
  const int k = BlockAtOrBefore(blocks_.data(), static_cast<int>(blocks_.size()), at);
  if (k < 0 || cols < 1) return std::nullopt;
  const ParamCopyBlock& block = blocks_[k];
  const int64_t local = at - block.offset;
  if (rows != block.row_length || ld != block.row_length || local % block.row_length != 0 ||
      local + cols * block.row_length > block.numel) {
    return std::nullopt;
  }
  return ParamCopyView{.copy_offset = block.copy_offset + local / block.row_length * block.ld,
                       .ld = block.ld};
}

}  // namespace cohort::compute
