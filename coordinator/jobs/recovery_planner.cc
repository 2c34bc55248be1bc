#include "coordinator/jobs/recovery_planner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/layout/mesh_hosts.h"
#include "common/layout/mesh_layout.h"
#include "common/layout/mesh_proto.h"

namespace cohort::coordinator {
namespace {

// The newest step any rank is known to have completed: what a survivor
// holds, or what the job reported (a rank may have completed a step that
// others had not when training stopped, and that rank may be gone).
int64_t Reached(const RecoveryInput& input) {
  int64_t reached = input.reported_step;
  for (const auto& [worker, step] : input.holders) reached = std::max(reached, step);
  return reached;
}

v1::RecoveryPlan Fallback(const RecoveryInput& input, const std::string& why) {
  v1::RecoveryPlan plan;
  const int64_t reached = Reached(input);
  if (input.checkpoint_step.has_value()) {
    plan.set_kind(v1::RECOVERY_KIND_CHECKPOINT);
    plan.set_step(*input.checkpoint_step);
    plan.set_checkpoint_step(*input.checkpoint_step);
    plan.set_lost_steps(std::max<int64_t>(0, reached - *input.checkpoint_step));
    plan.set_reason(absl::StrCat(why, "; resuming from the checkpoint of step ",
                                 *input.checkpoint_step));
  } else {
    plan.set_kind(v1::RECOVERY_KIND_NONE);
    plan.set_step(0);
    plan.set_lost_steps(reached);
    plan.set_reason(reached > 0 ? absl::StrCat(why, "; no checkpoint: starting over") : why);
  }
  return plan;
}

}  // namespace

namespace {

// The peer plan resuming at step `t`, if every piece of the state at `t`
// survives; otherwise nullopt and `*why` says which piece is missing.
std::optional<v1::RecoveryPlan> PlanAt(const RecoveryInput& input, int64_t t, std::string* why) {
  const StateSource& source = *input.source;

  const layout::MeshShape shape = layout::ShapeOf(source.mesh);
  const int world = shape.world();
  // Source rank -> holder's worker id (holding version t: newest t or t+1).
  std::vector<std::string> holder_at(static_cast<size_t>(world));
  for (const v1::MeshMember& m : source.mesh.members()) {
    auto it = input.holders.find(m.worker_id());
    const int rank = m.coordinates().rank();
    if (it == input.holders.end() || rank < 0 || rank >= world) continue;
    if (it->second == t || it->second == t + 1) holder_at[static_cast<size_t>(rank)] = m.worker_id();
  }
  // Participants: the new mesh's ranks, then donors in order of first use.
  std::map<std::string, int> participant;
  for (const v1::MeshMember& m : input.next_mesh.members()) {
    participant[m.worker_id()] = m.coordinates().rank();
  }
  const int members = input.next_mesh.members_size();
  std::set<std::string> in_next;
  for (const v1::MeshMember& m : input.next_mesh.members()) in_next.insert(m.worker_id());
  v1::RecoveryPlan plan;
  auto participant_of = [&](int source_rank) {
    const std::string& worker = holder_at[static_cast<size_t>(source_rank)];
    auto it = participant.find(worker);
    if (it != participant.end()) return it->second;
    const int index = members + plan.donors_size();
    participant[worker] = index;
    v1::Donor* donor = plan.add_donors();
    donor->set_worker_id(worker);
    for (const v1::MeshMember& m : source.mesh.members()) {
      if (m.worker_id() == worker) {
        donor->set_incarnation(m.incarnation());
        *donor->mutable_source_coordinates() = m.coordinates();
      }
    }
    return index;
  };
  const int copies = layout::OptimizerCopies(source.zero1, source.optimizer_replicas, shape.data);
  // Where the source generation's ranks put their copies (by their hosts).
  const std::vector<layout::CopyRing> rings = layout::CopyRingsOf(source.mesh);
  for (int r = 0; r < world; ++r) {
    const layout::MeshCoords coords = layout::CoordsOf(shape, r);
    // Weights: the owner, else the replicas starting after it (so the
    // pieces of a lost rank spread over the survivors); holders in the new
    // mesh first, so a survivor left out serves only what nobody else has.
    // Every data rank holds the weights; the optimizer piece is on its
    // owner's copy holders.
    const layout::CopyRing& ring =
        rings[static_cast<size_t>(layout::GroupIndex(shape, layout::Axis::kData, coords))];
    auto find_holder = [&](int holders) {
      for (const bool member_only : {true, false}) {
        for (int j = 0; j < holders; ++j) {
          layout::MeshCoords at = coords;
          at.data = ring.Holder(coords.data, j);
          const int candidate = layout::RankOf(shape, at);
          const std::string& worker = holder_at[static_cast<size_t>(candidate)];
          if (worker.empty() || (member_only && !in_next.contains(worker))) continue;
          return candidate;
        }
      }
      return -1;
    };
    const int params_holder = find_holder(shape.data);
    const int optimizer_holder = find_holder(copies);
    if (params_holder < 0 || optimizer_holder < 0) {
      *why = absl::StrCat("no survivor holds ", params_holder < 0 ? "the weights" :
                          "the optimizer state", " of source rank ", r, " (data ", coords.data,
                          ", tensor ", coords.tensor, ", pipeline ", coords.pipeline, ")");
      return std::nullopt;
    }
    v1::PieceSource* piece = plan.add_pieces();
    piece->set_params_from(participant_of(params_holder));
    piece->set_optimizer_from(participant_of(optimizer_holder));
    piece->set_optimizer_holder_rank(optimizer_holder);
  }
  std::vector<int> source_rank_of(static_cast<size_t>(members + plan.donors_size()), -1);
  for (int r = 0; r < world; ++r) {
    auto it = participant.find(holder_at[static_cast<size_t>(r)]);
    if (it != participant.end()) source_rank_of[static_cast<size_t>(it->second)] = r;
  }
  for (const int r : source_rank_of) plan.add_participant_source_ranks(r);
  plan.set_kind(v1::RECOVERY_KIND_PEER);
  plan.set_step(t);
  plan.set_source_generation(source.generation.value());
  plan.set_source_data_parallel(shape.data);
  plan.set_source_tensor_parallel(shape.tensor);
  plan.set_source_pipeline_parallel(shape.pipeline);
  plan.set_source_zero1(source.zero1);
  plan.set_source_optimizer_replicas(source.optimizer_replicas);
  // Steps some rank completed beyond t are computed again.
  plan.set_lost_steps(std::max<int64_t>(0, Reached(input) - t));
  plan.set_reason(absl::StrCat("every piece of generation ", source.generation.value(),
                               "'s state survives; resuming at step ", t));
  return plan;
}

}  // namespace

v1::RecoveryPlan PlanRecovery(const RecoveryInput& input) {
  if (!input.source.has_value() || input.holders.empty()) {
    return Fallback(input, input.source.has_value() ? "no survivor holds state" : "no state to recover");
  }
  int64_t oldest = std::numeric_limits<int64_t>::max();
  int64_t newest = std::numeric_limits<int64_t>::min();
  for (const auto& [worker, step] : input.holders) {
    oldest = std::min(oldest, step);
    newest = std::max(newest, step);
  }
  // The newest step whose every piece survives: the ranks that completed
  // oldest + 1 may hold all of it (without ZeRO-1 one data replica of each
  // shard does), sparing the step; else everyone's `oldest`. (No rank gets
  // further ahead: none completes a step before all completed the one
  // before.)
  std::string why;
  if (newest > oldest) {
    if (std::optional<v1::RecoveryPlan> plan = PlanAt(input, oldest + 1, &why)) return *plan;
  }
  if (std::optional<v1::RecoveryPlan> plan = PlanAt(input, oldest, &why)) return *plan;
  return Fallback(input, why);
}

bool IsSpareReplacement(const v1::RecoveryPlan& plan, const v1::Mesh& source,
                        const v1::Mesh& next) {
  if (plan.kind() != v1::RECOVERY_KIND_PEER) return false;
  if (source.data_parallel() != next.data_parallel() ||
      source.tensor_parallel() != next.tensor_parallel() ||
      source.pipeline_parallel() != next.pipeline_parallel()) {
    return false;
  }
  std::set<std::string> before;
  for (const v1::MeshMember& m : source.members()) before.insert(m.worker_id());
  for (const v1::MeshMember& m : next.members()) {
    if (!before.contains(m.worker_id())) return true;
  }
  return false;
}

}  // namespace cohort::coordinator
