#pragma once
// MeshGroups: which communicator groups one rank belongs to, computed from a
// job's mesh assignment (cohort.v1.Mesh). Pure logic: no I/O, no threads.
//
// Ranks, groups and group indices come from the layout library
// (common/layout/mesh_layout.h: Megatron order, tensor fastest): the tensor,
// data and pipeline groups of a rank, each ordered along its axis; the
// previous and next stage are its neighbours in the pipeline group.
//
// Ranks here are plain ints to match Communicator::rank().
//
// Communicator ids. Communicators sharing one transport context (one UCX
// worker) keep their messages apart by a 16-bit id in every tag, so every
// group of a mesh gets an id distinct from every other group of that mesh,
// and equal on all of the group's members:
//
//   bits 15..12  axis: 0 world, 1 tensor, 2 data, 3 pipeline
//   bits 11..0   the group's index (layout::AxisGroup::group_index; 0 for
//                the world)
//
// Ids never reach 0xf000 and above (0xffff is the UCX context's own); a mesh
// with 4096 or more groups on one axis is rejected.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cohort/v1/job.pb.h"

namespace cohort::comm {

// kDataLocal and kDataLane: a data group's sub-groups on one host and
// across hosts when its collectives are hierarchical
// (comm::HierarchicalCommunicator), numbered like their data group.
enum class MeshAxis : uint16_t {
  kWorld = 0,
  kTensor = 1,
  kData = 2,
  kPipeline = 3,
  kDataLocal = 4,
  kDataLane = 5,
};

const char* MeshAxisName(MeshAxis axis);

// Groups per axis are numbered below this (12 bits).
inline constexpr int kMaxGroupsPerAxis = 1 << 12;

// The communicator id of group `group_index` on `axis` (layout above).
// group_index must be in [0, kMaxGroupsPerAxis).
uint16_t MeshCommunicatorId(MeshAxis axis, int group_index);

struct MeshGroup {
  MeshAxis axis = MeshAxis::kWorld;
  // Global ranks of the members, ordered along the axis (the group rank of
  // ranks[i] is i).
  std::vector<int> ranks;
  // This rank's position in `ranks`.
  int index = 0;
  uint16_t communicator_id = 0;

  int size() const { return static_cast<int>(ranks.size()); }
  bool operator==(const MeshGroup&) const = default;
};

struct MeshGroups {
  int rank = 0;  // this rank (global)
  int world_size = 0;
  MeshGroup world;  // every rank in rank order
  MeshGroup tensor;
  MeshGroup data;
  MeshGroup pipeline;
  // Global ranks of the neighbouring pipeline stages; none at the ends.
  std::optional<int> previous_stage;
  std::optional<int> next_stage;
};

// OK if the mesh is complete and consistent: positive axis sizes; exactly
// dp * tp * pp members; every coordinate in range and present exactly once;
// every rank equal to p * (dp * tp) + d * tp + t; at most kMaxGroupsPerAxis
// groups per axis. Otherwise InvalidArgument naming the first problem.
absl::Status ValidateMesh(const v1::Mesh& mesh);

// The groups of the rank at `self` (its rank must match the formula too).
// InvalidArgument if the mesh is invalid (see ValidateMesh) or `self` is not
// one of its members' coordinates.
absl::StatusOr<MeshGroups> ComputeMeshGroups(const v1::Mesh& mesh, const v1::MeshCoordinates& self);

}  // namespace cohort::comm
