#pragma once
// The transfers of a peer recovery (coordinator/jobs/recovery_planner.h): which
// participant sends which box of which tensor to which, and in what order.
// Pure: every participant computes the same list from the same plan.
//
// A piece r of the source generation is what source rank r would write to a
// checkpoint (shard_plan.h PlanSave). Each new rank needs what it would load
// from one (PlanLoad). Every overlap of a need with a piece is a transfer
// from the piece's source (plan.pieces[r]) to the new rank; transfers larger
// than `max_elements` are cut. A transfer whose source and destination are
// the same participant is a local copy.
//
// Rounds: transfers between different participants are grouped so that in a
// round every participant sends at most one and receives at most one; each
// participant runs its rounds in order with one SendRecv each, so all pairs
// of a round move data at once and no round can deadlock (every send of a
// round meets its receive, posted by the peer in the same round).
//
// Thread-safety: pure functions.

#include <cstdint>
#include <vector>

#include "cohort/v1/job.pb.h"
#include "common/box.h"
#include "common/layout/mesh_layout.h"
#include "worker/checkpoint/shard_plan.h"

namespace cohort::checkpoint {

// A generation's layout as far as state goes.
struct StateLayout {
  layout::MeshShape shape;
  bool zero1 = false;
  int optimizer_replicas = 1;
  int world() const { return shape.world(); }
  friend bool operator==(const StateLayout&, const StateLayout&) = default;
};

// The source layout a plan names.
StateLayout SourceLayoutOf(const v1::RecoveryPlan& plan);

// Position of Megatron rank `rank` in `layout`.
RankPosition PositionOf(const StateLayout& layout, int rank);

struct Transfer {
  int from = 0;  // participant
  int to = 0;    // participant: the new rank
  StateKind kind = StateKind::kParam;
  model::ParamId tensor = model::kWte;
  int piece = 0;        // source rank whose piece this is
  int holder_rank = 0;  // source rank whose buffers hold it (AdamW moments: owner or mirror)
  Box region;           // global coordinates of the tensor
  int64_t elements() const { return region.NumElements(); }
};

// Every transfer of `plan` (kind PEER) into the new layout `next`, sorted by
// (to, from, kind, tensor, region start).
std::vector<Transfer> PlanTransfers(const model::GptConfig& config, const v1::RecoveryPlan& plan,
                                    const StateLayout& next, int64_t max_elements);

// Rounds of indices into `transfers` (non-local transfers only), as above.
std::vector<std::vector<int>> ScheduleRounds(const std::vector<Transfer>& transfers);

}  // namespace cohort::checkpoint
