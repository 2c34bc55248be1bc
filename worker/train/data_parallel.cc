#include "worker/train/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace cohort::train {

DataParallel::DataParallel(comm::Communicator* group, size_t num_params,
                           DataParallelOptions options)
    : group_(group != nullptr && group->size() > 1 ? group : nullptr),
      num_params_(num_params),
      options_(std::move(options)),
      dp_(group_ == nullptr ? 1 : group_->size()),
      rank_(group_ == nullptr ? 0 : group_->rank()),
      micro_batches_(std::accumulate(options_.micro_batch_shares.begin(),
                                     options_.micro_batch_shares.end(), 0)),
      reducer_(micro_batches_, LeafRangesOf(options_.micro_batch_shares)) {
  // The session checked the split against the group (TrainingSession::Create).
  CHECK(static_cast<int>(options_.micro_batch_shares.size()) == dp_)
      << "DataParallelOptions.micro_batch_shares: " << options_.micro_batch_shares.size()
      << " shares for " << dp_ << " data ranks";
  // One node per rank: the tree above the ranks' nodes is a fixed order
  // of additions over whole ranks, which a communicator can run its own way.
  bool single = options_.deterministic;
  for (int r = 0; r < dp_ && single; ++r) single = reducer_.nodes_of(r).size() == 1;
  if (single && dp_ > 1) {
    TreeFolder folder(micro_batches_);
    std::vector<TreeMerge> merges;
    for (int r = 0; r < dp_; ++r) folder.Push(reducer_.nodes_of(r)[0], r, &merges);
    for (const TreeMerge& m : merges) rank_merges_.emplace_back(m.into, m.from);
  }
  padded_ = layout::PaddedShardedSize(num_params_, dp_);
  shard_ = padded_ / static_cast<size_t>(dp_);
  for (int r = 0; r < dp_; ++r) owners_.push_back(layout::DataShardRange(num_params_, dp_, r));
  // The transport's ZeRO-1 reduce-scatter stages the padded gradient; the
  // deterministic reduction of a small gradient without ZeRO-1 gathers into
  // it. ZeRO-1's parameters are gathered in place (GatherParameters).
  const bool staged = options_.zero1 ? !options_.deterministic
                                     : options_.deterministic && padded_ <= kSmallGradientFloats;
  if (group_ != nullptr && staged) padded_buffer_.assign(padded_, 0.0f);
  if (options_.zero1) {
    const layout::ShardRange own = owners_[rank_];
    update_begin_ = own.begin;
    update_end_ = own.end;
    if (group_ != nullptr && !options_.deterministic) shard_buffer_.assign(shard_, 0.0f);
  } else {
    update_begin_ = 0;
    update_end_ = num_params_;
  }
}

absl::Status DataParallel::ReduceGradients(float* grads) {
  if (group_ == nullptr) return absl::OkStatus();
  if (!options_.zero1) {
    return group_->AllReduce(grads, num_params_, comm::DataType::kFloat32, comm::ReduceOp::kSum,
                             options_.timeout);
  }
  // The padding past num_params stays zero from construction.
  std::memcpy(padded_buffer_.data(), grads, num_params_ * sizeof(float));
  RETURN_IF_ERROR(group_->ReduceScatter(padded_buffer_.data(), shard_buffer_.data(), shard_,
                                        comm::DataType::kFloat32, comm::ReduceOp::kSum,
                                        options_.timeout));
  std::memcpy(grads + update_begin_, shard_buffer_.data(),
              (update_end_ - update_begin_) * sizeof(float));
  return absl::OkStatus();
}

absl::Status DataParallel::ReduceScatterTree(const std::vector<float*>& nodes, float* out) {
  if (!rank_merges_.empty() && !ordered_unavailable_) {
    const absl::Status ordered =
        group_->ReduceScatterOrdered(nodes[0], num_params_, shard_, out + owners_[rank_].begin,
                                     rank_merges_, options_.timeout);
    if (!absl::IsUnimplemented(ordered)) return ordered;
    ordered_unavailable_ = true;
  }
  return reducer_.ReduceScatter(group_, nodes, owners_, out, options_.num_threads,
                                options_.timeout);
}

absl::StatusOr<float*> DataParallel::ReduceGradientTree(const std::vector<float*>& nodes,
                                                        layout::ShardRange replicated) {
  if (group_ == nullptr) {
    // One rank folds every micro-batch: its tree is already the root.
    if (nodes.size() != 1) {
      return absl::InternalError(absl::StrCat("a single data rank ended its step with ",
                                              nodes.size(), " tree nodes instead of the root"));
    }
    return nodes[0];
  }
  if (!padded_buffer_.empty() && !options_.zero1) {
    // A small gradient without ZeRO-1: into the padded buffer, gathered by
    // the communicator's all-gather (one synchronised pass, where pairwise
    // rounds would each wait for a peer).
    float* out = padded_buffer_.data();
    RETURN_IF_ERROR(ReduceScatterTree(nodes, out));
    RETURN_IF_ERROR(group_->AllGather(out + shard_ * static_cast<size_t>(rank_), out, shard_,
                                      comm::DataType::kFloat32, options_.timeout));
    return out;
  }
  // In place in the first node: its slices for other owners have been sent
  // before any owner folds, and are then overwritten by the gather (no
  // second gradient-sized buffer).
  float* out = nodes.empty() ? nullptr : nodes[0];
  RETURN_IF_ERROR(ReduceScatterTree(nodes, out));
  const layout::ShardRange gathered =
      options_.zero1 ? replicated : layout::ShardRange{0, num_params_};
  if (gathered.size() > 0) {
    RETURN_IF_ERROR(TreeReducer::GatherRange(group_, owners_, gathered.begin, gathered.end, out,
                                             options_.timeout));
  }
  return out;
}

absl::StatusOr<double> DataParallel::Sum(double value) {
  if (group_ == nullptr) return value;
  RETURN_IF_ERROR(group_->AllReduce(&value, 1, comm::DataType::kFloat64, comm::ReduceOp::kSum,
                                    options_.timeout));
  return value;
}

absl::Status DataParallel::SumInPlace(std::vector<double>* values) {
  if (group_ == nullptr) return absl::OkStatus();
  return group_->AllReduce(values->data(), values->size(), comm::DataType::kFloat64,
                           comm::ReduceOp::kSum, options_.timeout);
}

absl::Status DataParallel::GatherParameters(float* params) {
  if (!options_.zero1 || group_ == nullptr) return absl::OkStatus();
  // In place, each owner's range straight into every rank's parameters: a
  // padded copy for the communicator's AllGather cost two copies of the
  // whole model per step (and per checkpoint restore) and a model-sized
  // buffer per rank.
  return TreeReducer::GatherRange(group_, owners_, 0, num_params_, params, options_.timeout);
}

}  // namespace cohort::train
