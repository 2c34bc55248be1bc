#pragma once
// StateVersions: what a rank keeps so that, whenever a peer fails, it can
// hand a consistent state to the next generation (docs/architecture.md,
// "Elasticity").
//
// A step mutates the rank's state only at its end: AdamW on the own range,
// the ZeRO-1 gather of the weights, and the refresh of the mirrors. Before
// that phase the rank copies what it will change (the whole shard's weights,
// the moments of its range, its mirrors) as the *previous* version; after it
// the current buffers hold the *current* version. So a rank always holds its
// newest complete step, and the one before it, unless it failed inside the
// end phase, where it holds only the one before (the current buffers are
// half written). No rank completes step s + 1 before every rank has completed
// step s, so every survivor holds the smallest newest step among them.
//
// Mirrors (ZeRO-1 with optimizer_replicas R > 1): the rank at position i of
// the data group's copy ring (layout::CopyRing: ranks dealt host by host)
// keeps copies of the moments of the ranks at positions i-1, ..., i-R+1,
// refreshed at the end of every step by R-1 shifts along the ring, so any
// R-1 of those ranks (or, with ranks spread over hosts, a whole host) can be
// lost without losing their optimizer state. Each mirror
// has two buffers: a refresh is received straight into the older one, which
// becomes the newer only once the whole refresh arrived, so the previous
// version costs no copy and a refresh cut short leaves both intact.
//
// Thread-compatible: the step runner's thread; views are read by the same
// thread between steps (or after the generation's training stopped).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/layout/mesh_layout.h"
#include "worker/comm/communicator.h"
#include "worker/model/gpt_model.h"
#include "worker/train/uninitialized_array.h"

namespace cohort::train {

struct StateVersionOptions {
  // Keep the previous version (for peer recovery). Off: only the current
  // buffers exist and a failure mid-update leaves nothing consistent.
  bool keep_previous = false;
  // Copies of each ZeRO-1 optimizer shard, the owner's included (1: none).
  int optimizer_replicas = 1;
  // The order copies follow (layout::CopyRingOf the mesh, of the data
  // group's size); none: the identity ring.
  std::optional<layout::CopyRing> copy_ring;
};

class StateVersions {
 public:
  // A consistent version's buffers.
  struct View {
    int64_t step = -1;
    const float* params = nullptr;  // the whole shard
    const float* adam_m = nullptr;  // the own update range
    const float* adam_v = nullptr;
    struct Mirror {
      int owner = 0;  // data rank whose moments these are
      const float* adam_m = nullptr;
      const float* adam_v = nullptr;
      size_t begin = 0, end = 0;  // its range
    };
    std::vector<Mirror> mirrors;
  };

  // `model`'s params and the moments `m`, `v` of [begin, end) are the current
  // buffers (they must outlive this object). `dp` and `dp_rank` place the
  // rank in its data group; mirrors exist with ZeRO-1 only.
  StateVersions(model::GptModel* model, float* m, float* v, size_t begin, size_t end, int dp,
                int dp_rank, bool zero1, StateVersionOptions options);

  // The current buffers hold a consistent state of `steps` steps (after a
  // restore, or a fresh start at 0).
  void SetCurrent(int64_t steps);
  // A restore into buffers that already hold versions (a session kept
  // across generations): BeginRestore before the current buffers are
  // overwritten (they hold no consistent version until EndRestore), then
  // EndRestore once they hold `steps` steps. The previous version and the
  // mirrors are left as they are, so a restore cut short still leaves them
  // to recover from.
  void BeginRestore() { current_step_ = -1; }
  void EndRestore(int64_t steps) { current_step_ = steps; }
  // Called once, at the start of the first end phase (BeforeUpdate): the
  // current weights are someone else's state too (a session that trains on
  // the model shard of an older generation's: that generation must stop
  // claiming them before they change).
  void set_on_first_update(std::function<void()> callback) {
    on_first_update_ = std::move(callback);
  }
  // Called before a view is handed out (Version): the moments the views
  // point at are host copies of a device optimizer's, refreshed then
  // (StepRunner's device-resident step); the weights refresh themselves
  // (GptModel::params).
  void set_host_refresh(std::function<void()> refresh) { host_refresh_ = std::move(refresh); }
  // Takes `other`'s previous-version and mirror buffers where they are
  // large enough (pages already in memory): `other` holds no version (a warm
  // spare's, about to be released) and is not used afterwards.
  void TakeBuffersOf(StateVersions& other);
  // Allocates and touches the previous version's buffers and the mirrors'
  // now rather than at the first step (a warm spare's session: its first
  // step after taking a place then faults in no fresh pages).
  void Reserve();
  // Before the end phase of the step that turns `steps` into `steps + 1`.
  void BeforeUpdate(int64_t steps);
  // Refreshes the mirrors from the data group (each rank's current moments,
  // those of `steps` steps, go to the next R-1 ranks). The communicator's
  // errors; the mirrors of the step before are kept either way. With
  // `only_missing` (after a restore), ranks whose mirrors already hold
  // `steps` (a session kept across generations) receive nothing: the ranks
  // first agree who needs them (one small all-gather), then only those
  // messages move.
  absl::Status ExchangeMirrors(comm::Communicator* data_group, int64_t steps,
                               absl::Duration timeout, bool only_missing = false);
  // After the end phase: the current buffers hold `steps` steps.
  void AfterUpdate(int64_t steps);

  // The newest consistent version, mirrors included (-1: none).
  int64_t newest() const;
  // The step the current buffers hold (-1: not consistent).
  int64_t current() const { return current_step_; }
  // Version `step`, if held. NotFound otherwise.
  absl::StatusOr<View> Version(int64_t step) const;

  int optimizer_replicas() const { return replicas_; }
  // Bytes held besides the current buffers.
  size_t extra_bytes() const;

 private:
  model::GptModel* const model_;
  float* const m_;
  float* const v_;
  const size_t begin_, end_;
  const int dp_, dp_rank_;
  const layout::CopyRing ring_;
  const StateVersionOptions options_;
  const int replicas_;  // mirrors = replicas_ - 1

  std::function<void()> on_first_update_;
  std::function<void()> host_refresh_;
  int64_t current_step_ = -1;  // -1: the current buffers are not consistent
  int64_t previous_step_ = -1;
  // Written (copied into) before they are read.
  UninitializedArray<float> previous_params_, previous_m_, previous_v_;
  struct MirrorBuffers {
    int owner = 0;
    size_t begin = 0, end = 0;
    UninitializedArray<float> m[2], v[2];
  };
  std::vector<MirrorBuffers> mirrors_;
  // Which of the two buffers each mirror's newest refresh went to, and the
  // step each buffer holds (-1: none); the same for every mirror.
  int newest_buffer_ = 0;
  int64_t mirror_step_[2] = {-1, -1};
  // The largest optimizer range of any data rank: buffers sized for it can
  // be handed to a session of another rank (TakeBuffersOf).
  size_t AnyRange() const {
    return std::max(end_ - begin_, layout::PaddedShardedSize(model_->num_params(), dp_) /
                                       static_cast<size_t>(dp_));
  }
  // The mirrors' view of `step` (their buffer index), or -1.
  int MirrorBufferOf(int64_t step) const;
};

}  // namespace cohort::train
