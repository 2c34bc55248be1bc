#include "worker/train/state_versions.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/train/data_parallel.h"

namespace cohort::train {
namespace {

constexpr uint32_t kMirrorTag = 0x6d697272;  // "mirr"

void Copy(const float* from, size_t n, UninitializedArray<float>* to) {
  to->Resize(n);
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
      ring_(options.copy_ring.value_or(layout::CopyRing(dp))),
      options_(options),
      // Without ZeRO-1 every data rank holds all of the state: no mirrors.
      replicas_(zero1 ? layout::OptimizerCopies(zero1, options.optimizer_replicas, dp) : 1) {
  for (int j = 1; j < replicas_; ++j) {
    MirrorBuffers mirror;
    mirror.owner = ring_.Owner(dp_rank_, j);
    const layout::ShardRange range = layout::DataShardRange(model_->num_params(), dp_, mirror.owner);
    mirror.begin = range.begin;
    mirror.end = range.end;
    // Not zeroed: a buffer is read only once a refresh filled it. Room for
    // any data rank's range (see AnyRange).
    for (int b = 0; b < 2; ++b) {
      mirror.m[b].Resize(range.end - range.begin, AnyRange());
      mirror.v[b].Resize(range.end - range.begin, AnyRange());
    }
    mirrors_.push_back(std::move(mirror));
  }
}

void StateVersions::SetCurrent(int64_t steps) {
  current_step_ = steps;
  previous_step_ = -1;
  mirror_step_[0] = mirror_step_[1] = -1;  // until the next refresh
}

void StateVersions::TakeBuffersOf(StateVersions& other) {
  // The previous version's buffers are sized at the first step: taken for
  // the size they will have, if this rank keeps one.
  const size_t weights = options_.keep_previous ? model_->num_params() : 0;
  const size_t own = options_.keep_previous ? end_ - begin_ : 0;
  previous_params_.TakeFrom(other.previous_params_, weights);
  previous_m_.TakeFrom(other.previous_m_, own);
  previous_v_.TakeFrom(other.previous_v_, own);
  for (size_t j = 0; j < mirrors_.size() && j < other.mirrors_.size(); ++j) {
    for (int b = 0; b < 2; ++b) {
      mirrors_[j].m[b].TakeFrom(other.mirrors_[j].m[b], mirrors_[j].m[b].size());
      mirrors_[j].v[b].TakeFrom(other.mirrors_[j].v[b], mirrors_[j].v[b].size());
    }
  }
}

void StateVersions::Reserve() {
  for (MirrorBuffers& mirror : mirrors_) {
    for (int b = 0; b < 2; ++b) {
      mirror.m[b].ResizeAndTouch(mirror.m[b].size());
      mirror.v[b].ResizeAndTouch(mirror.v[b].size());
    }
  }
  if (!options_.keep_previous) return;
  previous_params_.ResizeAndTouch(model_->num_params());
  previous_m_.ResizeAndTouch(end_ - begin_, AnyRange());
  previous_v_.ResizeAndTouch(end_ - begin_, AnyRange());
}

void StateVersions::BeforeUpdate(int64_t steps) {
  if (on_first_update_) std::exchange(on_first_update_, nullptr)();
  if (options_.keep_previous && current_step_ == steps) {
    // Read only: the const form leaves a staged model's device copy current.
    Copy(std::as_const(*model_).params(), model_->num_params(), &previous_params_);
    Copy(m_, end_ - begin_, &previous_m_);
    Copy(v_, end_ - begin_, &previous_v_);
    previous_step_ = steps;
  } else {
    previous_step_ = -1;
  }
  current_step_ = -1;  // being rewritten
}

absl::Status StateVersions::ExchangeMirrors(comm::Communicator* data_group, int64_t steps,
                                            absl::Duration timeout, bool only_missing) {
  if (mirrors_.empty()) return absl::OkStatus();
  if (data_group == nullptr || data_group->size() != dp_) {
    return absl::InvalidArgumentError("mirrors need the data group");
  }
  // Which ranks receive: all, or those without the mirrors of `steps`.
  std::vector<int32_t> needs(static_cast<size_t>(dp_), 1);
  if (only_missing) {
    const int32_t mine = MirrorBufferOf(steps) < 0 ? 1 : 0;
    RETURN_IF_ERROR(
        data_group->AllGather(&mine, needs.data(), 1, comm::DataType::kInt32, timeout));
    if (std::all_of(needs.begin(), needs.end(), [](int32_t n) { return n == 0; })) {
      return absl::OkStatus();
    }
  }
  const bool receive = needs[static_cast<size_t>(dp_rank_)] != 0;
  const int target = 1 - newest_buffer_;
  if (receive) mirror_step_[target] = -1;  // being overwritten
  const size_t own = end_ - begin_;
  for (size_t j = 0; j < mirrors_.size(); ++j) {
    MirrorBuffers& mirror = mirrors_[j];
    const int shift = static_cast<int>(j) + 1;
    const int to = ring_.Holder(dp_rank_, shift);
    const bool send = needs[static_cast<size_t>(to)] != 0;
    const size_t theirs = mirror.end - mirror.begin;
    // Straight from the moments into the mirror: no staging copies.
    const uint32_t tag = kMirrorTag + 2 * static_cast<uint32_t>(shift);
    for (const int part : {0, 1}) {
      const float* mine = part == 0 ? m_ : v_;
      float* into = (part == 0 ? mirror.m : mirror.v)[target].data();
      const uint32_t part_tag = tag + static_cast<uint32_t>(part);
      if (send && receive) {
        RETURN_IF_ERROR(data_group->SendRecv(mine, own * sizeof(float), to, into,
                                             theirs * sizeof(float), mirror.owner, part_tag,
                                             timeout));
      } else if (send) {
        RETURN_IF_ERROR(data_group->Send(mine, own * sizeof(float), to, part_tag, timeout));
      } else if (receive) {
        RETURN_IF_ERROR(
            data_group->Recv(into, theirs * sizeof(float), mirror.owner, part_tag, timeout));
      }
    }
  }
  if (receive) {
    newest_buffer_ = target;
    mirror_step_[target] = steps;
  }
  return absl::OkStatus();
}

void StateVersions::AfterUpdate(int64_t steps) { current_step_ = steps; }

int64_t StateVersions::newest() const {
  // A version counts once its mirrors (if any) are held too.
  int64_t newest = -1;
  for (const int64_t step : {current_step_, previous_step_}) {
    if (step > newest && (mirrors_.empty() || MirrorBufferOf(step) >= 0)) newest = step;
  }
  return newest;
}

int StateVersions::MirrorBufferOf(int64_t step) const {
  if (step >= 0 && mirror_step_[newest_buffer_] == step) return newest_buffer_;
  if (step >= 0 && mirror_step_[1 - newest_buffer_] == step) return 1 - newest_buffer_;
  return -1;
}

absl::StatusOr<StateVersions::View> StateVersions::Version(int64_t step) const {
  View view;
  view.step = step;
  if (step >= 0 && step == current_step_) {
    if (host_refresh_) host_refresh_();
    view.params = std::as_const(*model_).params();
    view.adam_m = m_;
    view.adam_v = v_;
  } else if (step >= 0 && step == previous_step_) {
    view.params = previous_params_.data();
    view.adam_m = previous_m_.data();
    view.adam_v = previous_v_.data();
  } else {
    return absl::NotFoundError(absl::StrCat("state of step ", step, " is not held (current ",
                                            current_step_, ", previous ", previous_step_, ")"));
  }
  if (!mirrors_.empty()) {
    const int b = MirrorBufferOf(step);
    if (b < 0) {
      return absl::NotFoundError(absl::StrCat("the optimizer mirrors of step ", step,
                                              " are not held (refreshed for steps ",
                                              mirror_step_[0], " and ", mirror_step_[1], ")"));
    }
    for (const MirrorBuffers& mirror : mirrors_) {
      view.mirrors.push_back(
          {mirror.owner, mirror.m[b].data(), mirror.v[b].data(), mirror.begin, mirror.end});
    }
  }
  return view;
}

size_t StateVersions::extra_bytes() const {
  size_t floats = previous_params_.capacity() + previous_m_.capacity() + previous_v_.capacity();
  for (const MirrorBuffers& mirror : mirrors_) {
    for (int b = 0; b < 2; ++b) floats += mirror.m[b].capacity() + mirror.v[b].capacity();
  }
  return floats * sizeof(float);
}

}  // namespace cohort::train
