#pragma once
// TreeReducer: the cross-rank half of the deterministic reduction
// (reduction_tree.h) over one data group, for any Communicator.
//
// Each data rank holds the values of its RangeNodes (one vector of `count`
// floats per node). ReduceScatter hands every owner the slices of its
// element range from every rank's nodes (one exchange with each peer, in
// dp - 1 rounds of SendRecv: each rank sends and receives (dp - 1) / dp of
// the vector per node, what a ring reduce-scatter moves) and the owner folds
// them in leaf order with TreeFolder. The result is the tree's root on every
// element, bitwise the same for any split of the leaves over ranks and any
// transport, because no addition depends on which rank performed it.
// GatherRange then copies the owners' results to every rank (the plain
// data-parallel all-reduce is ReduceScatter + the communicator's AllGather).
//
// Scratch memory is kept across calls. Thread-compatible.

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/layout/mesh_layout.h"
#include "worker/comm/communicator.h"
#include "worker/train/reduction_tree.h"

namespace cohort::train {

class TreeReducer {
 public:
  // `ranges`: every data rank's leaves, in rank order, tiling [0, leaves).
  TreeReducer(int leaves, std::vector<LeafRange> ranges);

  int leaves() const { return leaves_; }
  const std::vector<LeafRange>& ranges() const { return ranges_; }
  // The RangeNodes of data rank `rank`.
  const std::vector<TreeNode>& nodes_of(int rank) const { return nodes_[rank]; }

  // `nodes`: this rank's node values (nodes_of(group->rank()).size() of
  // them), each readable on every element of `owners`. `owners[r]` is the
  // element range rank r owns (disjoint). Writes the tree's root over rank
  // r's range into out[owners[r]] on rank r; `out` may be nodes[0], and
  // merges write into this rank's own node slices of its own range. `group`
  // null or of size 1: folds this rank's nodes alone (it must hold every
  // leaf). Errors: the communicator's; InvalidArgument for a node count or
  // group size that does not match the ranges.
  absl::Status ReduceScatter(comm::Communicator* group, const std::vector<float*>& nodes,
                             const std::vector<layout::ShardRange>& owners, float* out,
                             int num_threads, absl::Duration timeout);

  // Gives every rank each owner's part of [begin, end) of `data`, by
  // pairwise exchange. Errors: the communicator's.
  static absl::Status GatherRange(comm::Communicator* group,
                                  const std::vector<layout::ShardRange>& owners, size_t begin,
                                  size_t end, float* data, absl::Duration timeout);

 private:
  const int leaves_;
  const std::vector<LeafRange> ranges_;
  std::vector<std::vector<TreeNode>> nodes_;  // per rank
  std::vector<float> received_;  // the peers' slices of this rank's range
  std::vector<float> staged_;    // this rank's slices for one peer, when it has several nodes
  std::vector<float*> slots_;
  std::vector<TreeMerge> merges_;
};

}  // namespace cohort::train
