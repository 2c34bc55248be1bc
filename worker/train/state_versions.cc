#include "worker/train/state_versions.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/train/data_parallel.h"

namespace cohort::train {
namespace {

constexpr uint32_t kMirrorTag = 0x6d697272;  // "mirr"

void Copy(const float* from, size_t n, std::vector<float>* to) {
  to->resize(n);
  if (n > 0) std::memcpy(to->data(), from, n * sizeof(float));
}

}  // namespace

StateVersions::StateVersions(model::GptModel* model, float* m, float* v, size_t begin, size_t end,
                             int dp, int dp_rank, bool zero1, StateVersionOptions options)
    : model_(model),
      m_(m),
      v_(v),
      begin_(begin),
      end_(end),
      dp_(dp),
      dp_rank_(dp_rank),
      options_(options),
      replicas_(zero1 ? std::clamp(options.optimizer_replicas, 1, std::max(1, dp)) : 1) {
  for (int j = 1; j < replicas_; ++j) {
    MirrorBuffers mirror;
    mirror.owner = (dp_rank_ - j + dp_) % dp_;
    const ShardRange range = DataShardRange(model_->num_params(), dp_, mirror.owner);
    mirror.begin = range.begin;
    mirror.end = range.end;
    mirror.m.assign(range.end - range.begin, 0.0f);
    mirror.v.assign(range.end - range.begin, 0.0f);
    mirrors_.push_back(std::move(mirror));
  }
}

void StateVersions::SetCurrent(int64_t steps) {
  current_step_ = steps;
  previous_step_ = -1;
}

void StateVersions::BeforeUpdate(int64_t steps) {
  if (options_.keep_previous && current_step_ == steps) {
    Copy(model_->params(), model_->num_params(), &previous_params_);
    Copy(m_, end_ - begin_, &previous_m_);
    Copy(v_, end_ - begin_, &previous_v_);
    for (MirrorBuffers& mirror : mirrors_) {
      Copy(mirror.m.data(), mirror.m.size(), &mirror.previous_m);
      Copy(mirror.v.data(), mirror.v.size(), &mirror.previous_v);
    }
    previous_step_ = steps;
  } else {
    previous_step_ = -1;
  }
  current_step_ = -1;  // being rewritten
}

absl::Status StateVersions::ExchangeMirrors(comm::Communicator* data_group,
                                            absl::Duration timeout) {
  if (mirrors_.empty()) return absl::OkStatus();
  if (data_group == nullptr || data_group->size() != dp_) {
    return absl::InvalidArgumentError("mirrors need the data group");
  }
  const size_t own = end_ - begin_;
  exchange_.resize(2 * own);
  if (own > 0) {
    std::memcpy(exchange_.data(), m_, own * sizeof(float));
    std::memcpy(exchange_.data() + own, v_, own * sizeof(float));
  }
  for (size_t j = 0; j < mirrors_.size(); ++j) {
    MirrorBuffers& mirror = mirrors_[j];
    const int shift = static_cast<int>(j) + 1;
    const size_t theirs = mirror.end - mirror.begin;
    receive_.resize(2 * theirs);
    RETURN_IF_ERROR(data_group->SendRecv(exchange_.data(), 2 * own * sizeof(float),
                                         (dp_rank_ + shift) % dp_, receive_.data(),
                                         2 * theirs * sizeof(float), mirror.owner,
                                         kMirrorTag + static_cast<uint32_t>(shift), timeout));
    if (theirs > 0) {
      std::memcpy(mirror.m.data(), receive_.data(), theirs * sizeof(float));
      std::memcpy(mirror.v.data(), receive_.data() + theirs, theirs * sizeof(float));
    }
  }
  return absl::OkStatus();
}

void StateVersions::AfterUpdate(int64_t steps) { current_step_ = steps; }

int64_t StateVersions::newest() const { return std::max(current_step_, previous_step_); }

absl::StatusOr<StateVersions::View> StateVersions::Version(int64_t step) const {
  View view;
  view.step = step;
  if (step >= 0 && step == current_step_) {
    view.params = model_->params();
    view.adam_m = m_;
    view.adam_v = v_;
    for (const MirrorBuffers& mirror : mirrors_) {
      view.mirrors.push_back({mirror.owner, mirror.m.data(), mirror.v.data(), mirror.begin,
                              mirror.end});
    }
    return view;
  }
  if (step >= 0 && step == previous_step_) {
    view.params = previous_params_.data();
    view.adam_m = previous_m_.data();
    view.adam_v = previous_v_.data();
    for (const MirrorBuffers& mirror : mirrors_) {
      view.mirrors.push_back({mirror.owner, mirror.previous_m.data(), mirror.previous_v.data(),
                              mirror.begin, mirror.end});
    }
    return view;
  }
  return absl::NotFoundError(absl::StrCat("state of step ", step, " is not held (current ",
                                          current_step_, ", previous ", previous_step_, ")"));
}

size_t StateVersions::extra_bytes() const {
  size_t floats = previous_params_.capacity() + previous_m_.capacity() + previous_v_.capacity();
  for (const MirrorBuffers& mirror : mirrors_) {
    floats += mirror.m.capacity() + mirror.v.capacity() + mirror.previous_m.capacity() +
              mirror.previous_v.capacity();
  }
  return floats * sizeof(float);
}

}  // namespace cohort::train
