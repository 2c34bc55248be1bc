#include "worker/train/tree_reducer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/train/grad_norm.h"

namespace cohort::train {
namespace {

// NCCL has no tags, and every rank of the data group makes the same calls in
// the same order, so tag 0 cannot be confused with another message.
constexpr uint32_t kTreeTag = 0;

layout::ShardRange Clip(const layout::ShardRange& range, size_t begin, size_t end) {
  const size_t b = std::clamp(range.begin, begin, end);
  const size_t e = std::clamp(range.end, b, end);
  return layout::ShardRange{b, e};
}

}  // namespace

TreeReducer::TreeReducer(int leaves, std::vector<LeafRange> ranges)
    : leaves_(leaves), ranges_(std::move(ranges)) {
  nodes_.reserve(ranges_.size());
  for (const LeafRange& range : ranges_) {
    nodes_.push_back(RangeNodes(leaves_, range.begin, range.end));
  }
}

absl::Status TreeReducer::ReduceScatter(comm::Communicator* group,
                                        const std::vector<float*>& nodes,
                                        const std::vector<layout::ShardRange>& owners, float* out,
                                        int num_threads, absl::Duration timeout) {
  const int dp = group == nullptr ? 1 : group->size();
  const int rank = group == nullptr ? 0 : group->rank();
  if (static_cast<size_t>(dp) != ranges_.size() || owners.size() != ranges_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tree reduction over ", ranges_.size(),
                                                   " leaf ranges and ", owners.size(),
                                                   " owner ranges in a group of ", dp));
  }
  if (nodes.size() != nodes_[rank].size()) {
    return absl::InvalidArgumentError(absl::StrCat("tree reduction: rank ", rank, " gave ",
                                                   nodes.size(), " node values for its ",
                                                   nodes_[rank].size(), " nodes"));
  }
  const layout::ShardRange own = owners[rank];
  const size_t len = own.size();

  // Where each peer's slices of the own range land.
  std::vector<size_t> offset(static_cast<size_t>(dp), 0);
  size_t total = 0;
  for (int q = 0; q < dp; ++q) {
    if (q == rank) continue;
    offset[q] = total;
    total += nodes_[q].size() * len;
  }
  if (received_.size() < total) received_.resize(total);
  const size_t mine = nodes.size();
  for (int s = 1; s < dp; ++s) {
    const int to = (rank + s) % dp;
    const int from = (rank - s + dp) % dp;
    const layout::ShardRange theirs = owners[to];
    const float* send = nodes[0] + theirs.begin;
    if (mine > 1) {
      if (staged_.size() < mine * theirs.size()) staged_.resize(mine * theirs.size());
      for (size_t j = 0; j < mine; ++j) {
        std::memcpy(staged_.data() + j * theirs.size(), nodes[j] + theirs.begin,
                    theirs.size() * sizeof(float));
      }
      send = staged_.data();
    }
    RETURN_IF_ERROR(group->SendRecv(send, mine * theirs.size() * sizeof(float), to,
                                    received_.data() + offset[from],
                                    nodes_[from].size() * len * sizeof(float), from, kTreeTag,
                                    timeout));
  }

  // Fold every rank's nodes, in leaf order, over the own range.
  slots_.clear();
  TreeFolder folder(leaves_);
  for (int q = 0; q < dp; ++q) {
    for (size_t j = 0; j < nodes_[q].size(); ++j) {
      float* value = q == rank ? nodes[j] + own.begin
                               : received_.data() + offset[q] + j * len;
      slots_.push_back(value);
      merges_.clear();
      folder.Push(nodes_[q][j], static_cast<int>(slots_.size()) - 1, &merges_);
      for (const TreeMerge& m : merges_) AddInPlace(slots_[m.into], slots_[m.from], len, num_threads);
    }
  }
  if (!folder.complete()) {
    return absl::InternalError("tree reduction: the leaf ranges do not tile the tree");
  }
  const float* root = slots_[folder.stack()[0].slot];
  if (root != out + own.begin && len > 0) std::memcpy(out + own.begin, root, len * sizeof(float));
  return absl::OkStatus();
}

absl::Status TreeReducer::GatherRange(comm::Communicator* group,
                                      const std::vector<layout::ShardRange>& owners,
                                      size_t begin, size_t end, float* data,
                                      absl::Duration timeout) {
  if (group == nullptr || group->size() == 1) return absl::OkStatus();
  std::vector<comm::ByteRange> ranges;
  for (const layout::ShardRange& owned : owners) {
    const layout::ShardRange clipped = Clip(owned, begin, end);
    ranges.push_back({clipped.begin * sizeof(float), clipped.end * sizeof(float)});
  }
  return group->AllGatherRanges(data, ranges, kTreeTag, timeout);
}

}  // namespace cohort::train
