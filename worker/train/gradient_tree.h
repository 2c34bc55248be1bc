#pragma once
// GradientTree: a data rank's side of the reduction tree (reduction_tree.h).
// The gradients of the rank's micro-batches arrive one at a time in leaf
// order and are folded at once into the rank's RangeNodes: two siblings are
// added as soon as both exist, so at most about log2(micro-batches) partial
// sums are held. The cross-rank half (tree_reducer.h) then combines every
// rank's nodes. Buffers are kept across steps.
//
// Where the gradients stay in backend memory (a GPU's: the device-resident
// step, StepRunner), the tree's buffers are that backend's too and every
// addition and copy is a backend op (ResidualForward in place, CopyWithin),
// so the folds run where the gradients are; the pointers it takes and
// returns are then backend memory, never read by the host.
//
// Thread-compatible.

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "worker/compute/backend.h"
#include "worker/train/reduction_tree.h"
#include "worker/train/uninitialized_array.h"

namespace cohort::train {

class GradientTree {
 public:
  // `count` floats per gradient; this rank holds the leaves `range` of
  // `leaves`. `num_threads`: OpenMP threads of the additions (0 = all).
  GradientTree(size_t count, int leaves, LeafRange range, int num_threads);

  // Keeps the buffers in `backend` memory from now on (before the first
  // Add), allocating every buffer Add can need at once: ResourceExhausted
  // from the backend shows here, not mid-step. `backend` must outlive the
  // tree.
  absl::Status UseBackend(compute::Backend* backend);
  bool on_backend() const { return backend_ != nullptr; }

  const LeafRange& range() const { return range_; }
  // Starts a step's accumulation.
  void Begin();
  // Folds in the gradient of `leaf` (the range's next leaf). `values` may be
  // overwritten after the call, unless `kept`: the caller keeps it intact
  // until the step's reduction is done, so a node that is just this leaf
  // points at it instead of a copy (the range's last leaf).
  void Add(int leaf, float* values, bool kept);
  // After the range's last leaf: the values of its RangeNodes, in leaf order.
  std::vector<float*> Nodes();

  // The buffers Add needs at most for `range` of `leaves` (a kept last leaf
  // needs none).
  static int BuffersNeeded(int leaves, LeafRange range);
  // Allocates those buffers and writes zeros into them (their pages are in).
  void Reserve();
  // Takes `other`'s buffers that are large enough (a runner replacing
  // another on the same model shard); `other` allocates again should it run.
  void TakeBuffersOf(GradientTree& other);

 private:
  static constexpr int kIncoming = -1;  // the leaf being added
  static constexpr int kKept = -2;      // a kept leaf, left where it is

  float* Value(int slot);
  int Allocate();
  // dst += src and dst = src over count_ floats, where the buffers live.
  void AddInto(float* dst, const float* src);
  void CopyInto(float* dst, const float* src);
  compute::TensorSpan Span(const float* data) const;

  const size_t count_;
  const LeafRange range_;
  const int num_threads_;
  TreeFolder folder_;
  std::vector<UninitializedArray<float>> buffers_;
  std::vector<int> free_;
  std::vector<TreeMerge> merges_;
  float* incoming_ = nullptr;
  float* kept_ = nullptr;
  compute::Backend* backend_ = nullptr;
  std::vector<compute::Buffer> backend_buffers_;  // UseBackend's, instead of buffers_
};

}  // namespace cohort::train
