#include "coordinator/jobs/mesh_planner.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/layout/mesh_proto.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace cohort::coordinator {

namespace {

std::string Degrees(int tensor, int pipeline) {
  return absl::StrCat("tensor ", tensor, " x pipeline ", pipeline);
}

// Largest data-parallel degree in [lo, hi] that fits, or 0.
int64_t LargestFittingDp(int64_t lo, int64_t hi, int64_t micro_batches, bool even_shares) {
  for (int64_t dp = std::min(hi, micro_batches); dp >= lo && dp >= 1; --dp) {
    if (layout::MicroBatchesFit(micro_batches, dp, even_shares)) return dp;
  }
  return 0;
}

// Smallest data-parallel degree in [lo, hi] that fits, or 0.
int64_t SmallestFittingDp(int64_t lo, int64_t hi, int64_t micro_batches, bool even_shares) {
  for (int64_t dp = std::max<int64_t>(lo, 1); dp <= hi && dp <= micro_batches; ++dp) {
    if (layout::MicroBatchesFit(micro_batches, dp, even_shares)) return dp;
  }
  return 0;
}

// Free candidates of one host, in (device_index, id) order, consumed from the
// front.
struct HostPool {
  absl::string_view host;
  std::vector<int> free;  // indices into the sorted candidate list
  size_t next = 0;
  size_t remaining() const { return free.size() - next; }
  int Take() { return free[next++]; }
};

// Plans one mesh: holds the sorted candidates, per-host pools and the slot
// table while the phases below fill it.
class Placement {
 public:
  Placement(const PlanRequest& request, const MeshShape& shape)
      : request_(request), shape_(shape), slots_(shape.world(), -1) {}

  absl::Status Run() {
    RETURN_IF_ERROR(SortCandidates());
    KeepSurvivors();
    BuildHostPools();
    FillPartialGroupsOnTheirHost();
    FillEmptyGroupsOnOneHost();
    FillRemainingHoles();
    return absl::OkStatus();
  }

  v1::Mesh ToMesh() const {
    v1::Mesh mesh;
    mesh.set_data_parallel(shape_.data);
    mesh.set_tensor_parallel(shape_.tensor);
    mesh.set_pipeline_parallel(shape_.pipeline);
    for (int share : layout::MicroBatchShares(request_.micro_batches, shape_.data)) {
      mesh.add_micro_batches(share);
    }
    mesh.mutable_members()->Reserve(static_cast<int>(slots_.size()));
    for (int rank = 0; rank < static_cast<int>(slots_.size()); ++rank) {
      const PlannerWorker& worker = *sorted_[slots_[rank]];
      const layout::MeshCoords c = layout::CoordsOf(shape_, rank);
      v1::MeshMember* member = mesh.add_members();
      member->set_worker_id(worker.id.value());
      member->set_incarnation(worker.incarnation.value());
      member->set_host(worker.host);
      member->set_device_index(worker.device_index);
      layout::SetCoordinates(shape_, c, member->mutable_coordinates());
    }
    return mesh;
  }

 private:
  // Tensor groups, by their index in the layout library (pipeline * dp + data).
  int group_count() const { return layout::GroupsOnAxis(shape_, layout::Axis::kTensor); }

  absl::Status SortCandidates() {
    sorted_.reserve(request_.candidates.size());
    absl::flat_hash_set<absl::string_view> ids;
    ids.reserve(request_.candidates.size());
    for (const PlannerWorker& worker : request_.candidates) {
      if (!ids.insert(worker.id.value()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("candidates: worker ", worker.id.value(), " is listed twice"));
      }
      sorted_.push_back(&worker);
    }
    std::sort(sorted_.begin(), sorted_.end(), [](const PlannerWorker* a, const PlannerWorker* b) {
      return std::tie(a->host, a->device_index, a->id) < std::tie(b->host, b->device_index, b->id);
    });
    used_.assign(sorted_.size(), false);
    return absl::OkStatus();
  }

  // Members of the previous mesh that are still candidates keep their
  // coordinates when those exist in the new shape.
  void KeepSurvivors() {
    if (request_.previous == nullptr || request_.previous->members().empty()) return;
    absl::flat_hash_map<absl::string_view, int> index_of;
    index_of.reserve(sorted_.size());
    for (int i = 0; i < static_cast<int>(sorted_.size()); ++i) {
      index_of.emplace(sorted_[i]->id.value(), i);
    }
    for (const v1::MeshMember& member : request_.previous->members()) {
      auto it = index_of.find(member.worker_id());
      if (it == index_of.end() || used_[it->second]) continue;  // gone, or listed twice
      const layout::MeshCoords coords = layout::CoordsOf(member.coordinates());
      if (!layout::InMesh(shape_, coords)) continue;  // gone (e.g. dp shrank)
      const int rank = layout::RankOf(shape_, coords);
      if (slots_[rank] != -1) continue;  // a corrupt previous mesh with a clash
      slots_[rank] = it->second;
      used_[it->second] = true;
    }
  }

  void BuildHostPools() {
    for (int i = 0; i < static_cast<int>(sorted_.size()); ++i) {
      const absl::string_view host = sorted_[i]->host;
      if (pools_.empty() || pools_.back().host != host) {
        pool_of_host_.emplace(host, static_cast<int>(pools_.size()));
        pools_.push_back(HostPool{host, {}, 0});
      }
      if (!used_[i]) pools_.back().free.push_back(i);
    }
  }

  // The slot of tensor group `group`'s member at tensor coordinate `t`.
  int& Slot(int group, int t) {
    return slots_[layout::RankOf(shape_, layout::GroupMember(shape_, layout::Axis::kTensor, group, t))];
  }

  int CountFilled(int group) {
    int filled = 0;
    for (int t = 0; t < shape_.tensor; ++t) filled += Slot(group, t) != -1;
    return filled;
  }

  // Holes in a group that still has members go to the host holding most of
  // them (ties: smaller host name), so the group stays together.
  void FillPartialGroupsOnTheirHost() {
    for (int group = 0; group < group_count(); ++group) {
      const int filled = CountFilled(group);
      if (filled == 0 || filled == shape_.tensor) continue;
      host_counts_.clear();
      absl::string_view best_host;
      int best_count = 0;
      for (int t = 0; t < shape_.tensor; ++t) {
        const int slot = Slot(group, t);
        if (slot == -1) continue;
        const absl::string_view host = sorted_[slot]->host;
        const int count = ++host_counts_[host];
        if (count > best_count || (count == best_count && host < best_host)) {
          best_host = host;
          best_count = count;
        }
      }
      HostPool& pool = pools_[pool_of_host_.at(best_host)];
      for (int t = 0; t < shape_.tensor && pool.remaining() > 0; ++t) {
        int& slot = Slot(group, t);
        if (slot == -1) slot = pool.Take();
      }
    }
  }

  // Groups with no members take tp workers of one host, hosts in name order.
  void FillEmptyGroupsOnOneHost() {
    size_t host = 0;
    for (int group = 0; group < group_count(); ++group) {
      if (CountFilled(group) != 0) continue;
      while (host < pools_.size() &&
             pools_[host].remaining() < static_cast<size_t>(shape_.tensor)) {
        ++host;
      }
      if (host == pools_.size()) return;  // no host can hold a whole group any more
      for (int t = 0; t < shape_.tensor; ++t) {
        Slot(group, t) = pools_[host].Take();
      }
    }
  }

  // Whatever is left: free workers in (host, device_index, id) order fill the
  // holes in rank order, so a mixed group spans as few hosts as it can.
  void FillRemainingHoles() {
    size_t host = 0;
    for (int& slot : slots_) {
      if (slot != -1) continue;
      while (host < pools_.size() && pools_[host].remaining() == 0) ++host;
      CHECK(host < pools_.size()) << "ChooseShape admitted more slots than candidates";
      slot = pools_[host].Take();
    }
  }

  const PlanRequest& request_;
  const MeshShape shape_;
  std::vector<const PlannerWorker*> sorted_;  // by (host, device_index, id)
  std::vector<bool> used_;                    // kept by a survivor
  std::vector<HostPool> pools_;               // in host name order
  absl::flat_hash_map<absl::string_view, int> pool_of_host_;
  absl::flat_hash_map<absl::string_view, int> host_counts_;  // scratch, one group
  std::vector<int> slots_;  // rank -> index into sorted_, -1 while a hole
};

}  // namespace

absl::StatusOr<MeshShape> MeshPlanner::ChooseShape(const PlanRequest& request, int available) {
  const int tp = request.tensor;
  const int pp = request.pipeline;
  if (tp < 1 || pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel degrees must be >= 1, got ", Degrees(tp, pp)));
  }
  if (request.micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch count must be >= 1, got ", request.micro_batches));
  }
  if (request.min_workers < 1 || request.max_workers < request.min_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker bounds must satisfy 1 <= min_workers <= max_workers, got ",
                     request.min_workers, " and ", request.max_workers));
  }
  const int64_t replica = int64_t{tp} * pp;  // workers per data-parallel replica
  if (replica > request.max_workers) {
    return absl::InvalidArgumentError(absl::StrCat(Degrees(tp, pp), " needs ", replica,
                                                   " workers per replica, more than max_workers ",
                                                   request.max_workers));
  }
  const int64_t lo = (request.min_workers + replica - 1) / replica;
  const int64_t hi = request.max_workers / replica;
  const int64_t smallest = SmallestFittingDp(lo, hi, request.micro_batches, request.even_shares);
  if (smallest == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no data parallel degree in [", lo, ", ", hi, "] (", request.min_workers, " to ",
        request.max_workers, " workers with ", Degrees(tp, pp), ") ",
        request.even_shares ? "divides " : "is at most ", request.micro_batches,
        " micro-batches per step"));
  }
  const int64_t usable = std::min<int64_t>(request.max_workers, std::max(available, 0));
  const int64_t dp =
      LargestFittingDp(lo, usable / replica, request.micro_batches, request.even_shares);
  if (dp == 0) {
    std::string message = absl::StrCat(Degrees(tp, pp), " needs at least ", smallest * replica,
                                       " workers; ", available, " available");
    if (smallest > 1) {
      absl::StrAppend(&message, " (smallest usable data parallel degree is ", smallest,
                      ": min_workers ", request.min_workers, ", ", request.micro_batches,
                      " micro-batches per step)");
    }
    return absl::FailedPreconditionError(message);
  }
  return MeshShape{static_cast<int>(dp), tp, pp};
}

absl::StatusOr<v1::Mesh> MeshPlanner::Plan(const PlanRequest& request) {
  absl::StatusOr<MeshShape> shape =
      ChooseShape(request, static_cast<int>(request.candidates.size()));
  if (!shape.ok()) return shape.status();
  Placement placement(request, *shape);
  absl::Status status = placement.Run();
  if (!status.ok()) return status;
  return placement.ToMesh();
}

}  // namespace cohort::coordinator
