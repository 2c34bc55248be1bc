#pragma once
// The fixed reduction tree over a step's micro-batches: the order in which
// the gradient (and the loss) of the global batch is summed, whatever the
// data-parallel layout (docs/architecture.md, "Deterministic reduction").
//
// The step's M micro-batches are the leaves 0..M-1 of the binary tree over
// P = the next power of two >= M leaves; leaves >= M are absent. A node
// [begin, begin + size) (size a power of two, begin a multiple of it) has the
// value left + right when both children hold a present leaf, and the value of
// its left child when only that one does. Floating-point addition is
// commutative, so each node's bits depend only on its children's bits: the
// root is the same number whichever process computed which node, provided
// every node is computed as exactly one addition of its two children.
//
// A data rank holding the contiguous leaves [a, b) can compute every node
// whose present leaves all lie in [a, b); it reduces to the fewest such
// nodes (RangeNodes: the maximal ones, in leaf order), and the cross-rank
// reduction combines every rank's nodes, in leaf order, the same way.
//
// TreeFolder does that combining for any value type: it is told the nodes in
// leaf order and answers which node values to add into which.
//
// Thread-compatible.

#include <cstdint>
#include <vector>


namespace cohort::train {

struct TreeNode {
  int begin = 0;
  int size = 1;
  int end() const { return begin + size; }
  friend bool operator==(const TreeNode&, const TreeNode&) = default;
};

// value[into] += value[from]; `from` is free afterwards. Slots are the
// caller's handles for node values.
struct TreeMerge {
  int into = 0;
  int from = 0;
};

class TreeFolder {
 public:
  // `leaves` >= 1: the step's micro-batch count M.
  explicit TreeFolder(int leaves);

  int leaves() const { return leaves_; }
  // Pushes `node`, whose value is in `slot`: it must start where the
  // previously pushed node's present leaves end (the first at leaf 0, or at
  // `first` given to Reset). Appends the additions it makes possible, in the
  // order they must run, to `merges`.
  void Push(TreeNode node, int slot, std::vector<TreeMerge>* merges);
  // Starts over, expecting the next push at leaf `first`.
  void Reset(int first = 0);

  struct Entry {
    TreeNode node;
    int slot = 0;
  };
  // The nodes pushed and not yet merged into others, in leaf order.
  const std::vector<Entry>& stack() const { return stack_; }
  // Moves the value of the newest unmerged node to `slot`.
  void set_top_slot(int slot) { stack_.back().slot = slot; }
  // Whether every leaf has been pushed and folded into the root.
  bool complete() const;

 private:
  // Merges and promotes the top of the stack while it can.
  void Fold(std::vector<TreeMerge>* merges);

  const int leaves_;
  int padded_ = 1;  // P
  int next_ = 0;    // the leaf the next push must start at
  std::vector<Entry> stack_;
};

// The maximal nodes a rank holding leaves [begin, end) computes, in leaf
// order (0 <= begin < end <= leaves).
std::vector<TreeNode> RangeNodes(int leaves, int begin, int end);

// The sum of `values` (`leaves` of them, one per micro-batch) in the tree's
// order.
double TreeSum(const double* values, int leaves);

// Contiguous leaf ranges of data ranks holding `counts[r]` >= 1 leaves each
// (rank order = leaf order).
struct LeafRange {
  int begin = 0;
  int end = 0;
  int count() const { return end - begin; }
  friend bool operator==(const LeafRange&, const LeafRange&) = default;
};
std::vector<LeafRange> LeafRangesOf(const std::vector<int>& counts);

}  // namespace cohort::train
