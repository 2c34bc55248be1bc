#include "worker/train/reduction_tree.h"

#include <algorithm>
#include <cassert>

namespace cohort::train {

TreeFolder::TreeFolder(int leaves) : leaves_(std::max(1, leaves)) {
  while (padded_ < leaves_) padded_ *= 2;
}

void TreeFolder::Reset(int first) {
  stack_.clear();
  next_ = first;
}

void TreeFolder::Push(TreeNode node, int slot, std::vector<TreeMerge>* merges) {
  assert(node.begin == next_ && node.size >= 1 && node.begin % node.size == 0);
  next_ = std::min(node.end(), leaves_);
  stack_.push_back(Entry{node, slot});
  Fold(merges);
}

void TreeFolder::Fold(std::vector<TreeMerge>* merges) {
  while (!stack_.empty()) {
    Entry& top = stack_.back();
    const int size = top.node.size;
    if (size >= padded_) return;  // the root
    if (top.node.begin % (2 * size) == 0) {
      // A left child: its parent has its value when the right sibling holds
      // no present leaf; otherwise it waits for that sibling.
      if (top.node.end() < leaves_) return;
      top.node.size = 2 * size;
      continue;
    }
    // A right child: add it into its left sibling when that is on the stack.
    if (stack_.size() < 2) return;
    Entry& left = stack_[stack_.size() - 2];
    if (left.node.size != size || left.node.end() != top.node.begin) return;
    merges->push_back(TreeMerge{left.slot, top.slot});
    left.node.size = 2 * size;
    stack_.pop_back();
  }
}

bool TreeFolder::complete() const {
  return next_ >= leaves_ && stack_.size() == 1 && stack_[0].node.size == padded_;
}

std::vector<TreeNode> RangeNodes(int leaves, int begin, int end) {
  TreeFolder folder(leaves);
  folder.Reset(begin);
  std::vector<TreeMerge> merges;
  for (int leaf = begin; leaf < end; ++leaf) folder.Push(TreeNode{leaf, 1}, leaf, &merges);
  std::vector<TreeNode> nodes;
  nodes.reserve(folder.stack().size());
  for (const TreeFolder::Entry& entry : folder.stack()) nodes.push_back(entry.node);
  return nodes;
}

double TreeSum(const double* values, int leaves) {
  std::vector<double> slots(values, values + leaves);
  TreeFolder folder(leaves);
  std::vector<TreeMerge> merges;
  for (int leaf = 0; leaf < leaves; ++leaf) {
    merges.clear();
    folder.Push(TreeNode{leaf, 1}, leaf, &merges);
    for (const TreeMerge& m : merges) slots[m.into] += slots[m.from];
  }
  return leaves > 0 ? slots[0] : 0.0;
}

std::vector<LeafRange> LeafRangesOf(const std::vector<int>& counts) {
  std::vector<LeafRange> ranges;
  ranges.reserve(counts.size());
  int begin = 0;
  for (int count : counts) {
    ranges.push_back(LeafRange{begin, begin + count});
    begin += count;
  }
  return ranges;
}

}  // namespace cohort::train
