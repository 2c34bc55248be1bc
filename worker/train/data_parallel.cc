#include "worker/train/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/status_macros.h"

namespace cohort::train {

DataParallel::DataParallel(comm::Communicator* group, size_t num_params,
                           DataParallelOptions options)
    : group_(group != nullptr && group->size() > 1 ? group : nullptr),
      num_params_(num_params),
      options_(options),
      dp_(group_ == nullptr ? 1 : group_->size()),
      rank_(group_ == nullptr ? 0 : group_->rank()) {
  padded_ = layout::PaddedShardedSize(num_params_, dp_);
  shard_ = padded_ / static_cast<size_t>(dp_);
  if (options_.zero1) {
    const layout::ShardRange own = layout::DataShardRange(num_params_, dp_, rank_);
    update_begin_ = own.begin;
    update_end_ = own.end;
    if (group_ != nullptr) {
      padded_buffer_.assign(padded_, 0.0f);
      shard_buffer_.assign(shard_, 0.0f);
    }
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
  float* own = padded_buffer_.data() + shard_ * static_cast<size_t>(rank_);
  std::memcpy(own, params + update_begin_, (update_end_ - update_begin_) * sizeof(float));
  RETURN_IF_ERROR(group_->AllGather(own, padded_buffer_.data(), shard_, comm::DataType::kFloat32,
                                    options_.timeout));
  std::memcpy(params, padded_buffer_.data(), num_params_ * sizeof(float));
  return absl::OkStatus();
}

}  // namespace cohort::train
