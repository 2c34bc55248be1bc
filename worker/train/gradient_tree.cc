#include "worker/train/gradient_tree.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "common/log.h"
#include "worker/train/grad_norm.h"

namespace cohort::train {

GradientTree::GradientTree(size_t count, int leaves, LeafRange range, int num_threads)
    : count_(count), range_(range), num_threads_(num_threads), folder_(leaves) {}

absl::Status GradientTree::UseBackend(compute::Backend* backend) {
  backend_ = backend;
  buffers_.clear();
  backend_buffers_.clear();
  const int needed = BuffersNeeded(folder_.leaves(), range_);
  for (int i = 0; i < needed; ++i) {
    absl::StatusOr<compute::Buffer> buffer =
        backend->Allocate(compute::DType::kFloat32, count_);
    if (!buffer.ok()) return buffer.status();
    backend_buffers_.push_back(*std::move(buffer));
  }
  return absl::OkStatus();
}

void GradientTree::Begin() {
  folder_.Reset(range_.begin);
  free_.clear();
  const size_t buffers = on_backend() ? backend_buffers_.size() : buffers_.size();
  for (int i = static_cast<int>(buffers) - 1; i >= 0; --i) free_.push_back(i);
  kept_ = nullptr;
}

float* GradientTree::Value(int slot) {
  if (slot == kIncoming) return incoming_;
  if (slot == kKept) return kept_;
  if (on_backend()) return static_cast<float*>(backend_buffers_[slot].data());
  return buffers_[slot].data();
}

compute::TensorSpan GradientTree::Span(const float* data) const {
  return compute::TensorSpan{const_cast<float*>(data), compute::DType::kFloat32, count_};
}

void GradientTree::AddInto(float* dst, const float* src) {
  if (on_backend()) {
    backend_->ResidualForward(Span(dst), Span(dst), Span(src), count_);
  } else {
    AddInPlace(dst, src, count_, num_threads_);
  }
}

void GradientTree::CopyInto(float* dst, const float* src) {
  if (on_backend()) {
    backend_->CopyWithin(Span(dst), Span(src));
  } else {
    std::memcpy(dst, src, count_ * sizeof(float));
  }
}

int GradientTree::Allocate() {
  if (on_backend()) {
    // UseBackend allocated the most Add can hold at once.
    CHECK(!free_.empty()) << "gradient tree: more nodes than BuffersNeeded";
    const int slot = free_.back();
    free_.pop_back();
    return slot;
  }
  if (!free_.empty()) {
    const int slot = free_.back();
    free_.pop_back();
    buffers_[slot].Resize(count_);
    return slot;
  }
  buffers_.emplace_back();
  buffers_.back().Resize(count_);
  return static_cast<int>(buffers_.size()) - 1;
}

void GradientTree::Add(int leaf, float* values, bool kept) {
  incoming_ = values;
  merges_.clear();
  folder_.Push(TreeNode{leaf, 1}, kIncoming, &merges_);
  for (const TreeMerge& m : merges_) {
    assert(m.into >= 0);
    AddInto(Value(m.into), Value(m.from));
    if (m.from >= 0) free_.push_back(m.from);
  }
  if (folder_.stack().back().slot == kIncoming) {
    // The leaf waits for its sibling, or ends the range unmerged.
    if (kept) {
      kept_ = values;
      folder_.set_top_slot(kKept);
    } else {
      const int slot = Allocate();
      CopyInto(Value(slot), values);
      folder_.set_top_slot(slot);
    }
  }
  incoming_ = nullptr;
}

std::vector<float*> GradientTree::Nodes() {
  std::vector<float*> nodes;
  nodes.reserve(folder_.stack().size());
  for (const TreeFolder::Entry& entry : folder_.stack()) nodes.push_back(Value(entry.slot));
  return nodes;
}

int GradientTree::BuffersNeeded(int leaves, LeafRange range) {
  TreeFolder folder(leaves);
  folder.Reset(range.begin);
  std::vector<TreeMerge> merges;
  size_t most = 0;
  for (int leaf = range.begin; leaf < range.end; ++leaf) {
    folder.Push(TreeNode{leaf, 1}, leaf, &merges);
    const bool last_unmerged = leaf + 1 == range.end && folder.stack().back().slot == leaf;
    most = std::max(most, folder.stack().size() - (last_unmerged ? 1 : 0));
  }
  return static_cast<int>(most);
}

void GradientTree::Reserve() {
  if (on_backend()) return;  // UseBackend allocated them
  const int needed = BuffersNeeded(folder_.leaves(), range_);
  while (static_cast<int>(buffers_.size()) < needed) buffers_.emplace_back();
  for (UninitializedArray<float>& buffer : buffers_) buffer.ResizeAndTouch(count_);
}

void GradientTree::TakeBuffersOf(GradientTree& other) {
  if (on_backend() || other.on_backend()) return;  // backend buffers stay with their tree
  const int needed = BuffersNeeded(folder_.leaves(), range_);
  for (UninitializedArray<float>& theirs : other.buffers_) {
    if (static_cast<int>(buffers_.size()) >= needed) break;
    UninitializedArray<float> taken;
    if (taken.TakeFrom(theirs, count_)) buffers_.push_back(std::move(taken));
  }
  other.buffers_.erase(std::remove_if(other.buffers_.begin(), other.buffers_.end(),
                                      [](const UninitializedArray<float>& b) {
                                        return b.capacity() == 0;
                                      }),
                       other.buffers_.end());
}

}  // namespace cohort::train
