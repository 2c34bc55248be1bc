#include "worker/comm/mesh_groups.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/layout/mesh_layout.h"
#include "common/layout/mesh_proto.h"
#include "common/log.h"

namespace cohort::comm {
namespace {

using layout::CoordsOf;
using layout::ShapeOf;

std::string Describe(const v1::MeshCoordinates& c) {
  return absl::StrCat("(data ", c.data(), ", tensor ", c.tensor(), ", pipeline ", c.pipeline(),
                      ", rank ", c.rank(), ")");
}

// Range and rank-formula checks of one coordinate set.
absl::Status CheckCoordinates(const layout::MeshShape& shape, const v1::MeshCoordinates& c,
                              const std::string& what) {
  if (!layout::InMesh(shape, CoordsOf(c))) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " coordinates ", Describe(c), " are outside the mesh (data_parallel ", shape.data,
        ", tensor_parallel ", shape.tensor, ", pipeline_parallel ", shape.pipeline, ")"));
  }
  const int expected = layout::RankOf(shape, CoordsOf(c));
  if (c.rank() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " coordinates ", Describe(c), " have rank ", c.rank(),
                     " but the layout gives ", expected,
                     " (rank = pipeline * data_parallel * tensor_parallel + data * "
                     "tensor_parallel + tensor)"));
  }
  return absl::OkStatus();
}

MeshGroup MakeGroup(MeshAxis axis, layout::AxisGroup members) {
  MeshGroup group;
  group.axis = axis;
  group.ranks = std::move(members.ranks);
  group.index = members.index;
  group.communicator_id = MeshCommunicatorId(axis, members.group_index);
  return group;
}

}  // namespace

const char* MeshAxisName(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kWorld:
      return "world";
    case MeshAxis::kTensor:
      return "tensor";
    case MeshAxis::kData:
      return "data";
    case MeshAxis::kPipeline:
      return "pipeline";
    case MeshAxis::kDataLocal:
      return "data-local";
    case MeshAxis::kDataLane:
      return "data-lane";
  }
  return "unknown";
}

uint16_t MeshCommunicatorId(MeshAxis axis, int group_index) {
  CHECK(group_index >= 0 && group_index < kMaxGroupsPerAxis) << "group index " << group_index;
  return static_cast<uint16_t>((static_cast<uint16_t>(axis) << 12) |
                               static_cast<uint16_t>(group_index));
}

absl::Status ValidateMesh(const v1::Mesh& mesh) {
  // Before ShapeOf, which counts an unset degree as 1.
  if (mesh.data_parallel() < 1 || mesh.tensor_parallel() < 1 || mesh.pipeline_parallel() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh axis sizes must be >= 1: data_parallel ", mesh.data_parallel(),
        ", tensor_parallel ", mesh.tensor_parallel(), ", pipeline_parallel ",
        mesh.pipeline_parallel()));
  }
  const layout::MeshShape shape = ShapeOf(mesh);
  // In 64 bits: the product of three int32s from the wire may overflow int.
  const int64_t world = int64_t{shape.data} * shape.tensor * shape.pipeline;
  if (world != mesh.members_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh has ", mesh.members_size(), " members but data_parallel ", shape.data,
        " x tensor_parallel ", shape.tensor, " x pipeline_parallel ", shape.pipeline, " = ",
        world));
  }
  // Groups per axis: the product of the other two sizes (in 64 bits, before
  // the layout's int arithmetic may be used).
  if (int64_t{shape.data} * shape.pipeline > kMaxGroupsPerAxis ||
      int64_t{shape.tensor} * shape.pipeline > kMaxGroupsPerAxis ||
      int64_t{shape.data} * shape.tensor > kMaxGroupsPerAxis) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh too large: more than ", kMaxGroupsPerAxis,
                     " groups on one axis do not fit the 12-bit communicator group index"));
  }
  std::vector<int> member_at_rank(static_cast<size_t>(world), -1);
  for (int i = 0; i < mesh.members_size(); ++i) {
    const v1::MeshMember& member = mesh.members(i);
    const std::string what = absl::StrCat("member ", i, " (worker '", member.worker_id(), "')");
    if (!member.has_coordinates()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has no coordinates"));
    }
    const v1::MeshCoordinates& c = member.coordinates();
    if (absl::Status s = CheckCoordinates(shape, c, what); !s.ok()) return s;
    int& seen = member_at_rank[static_cast<size_t>(c.rank())];
    if (seen >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " and member ", seen, " both hold coordinates ", Describe(c)));
    }
    seen = i;
  }
  // members_size == world and no duplicates, so every coordinate is covered.
  return absl::OkStatus();
}

absl::StatusOr<MeshGroups> ComputeMeshGroups(const v1::Mesh& mesh,
                                             const v1::MeshCoordinates& self) {
  if (absl::Status s = ValidateMesh(mesh); !s.ok()) return s;
  const layout::MeshShape shape = ShapeOf(mesh);
  if (absl::Status s = CheckCoordinates(shape, self, "this rank's"); !s.ok()) return s;
  const layout::MeshCoords coords = CoordsOf(self);

  MeshGroups groups;
  groups.rank = self.rank();
  groups.world_size = shape.world();

  layout::AxisGroup world;
  for (int r = 0; r < groups.world_size; ++r) world.ranks.push_back(r);
  world.index = groups.rank;
  groups.world = MakeGroup(MeshAxis::kWorld, std::move(world));
  groups.tensor = MakeGroup(MeshAxis::kTensor, layout::GroupOf(shape, layout::Axis::kTensor, coords));
  groups.data = MakeGroup(MeshAxis::kData, layout::GroupOf(shape, layout::Axis::kData, coords));
  groups.pipeline =
      MakeGroup(MeshAxis::kPipeline, layout::GroupOf(shape, layout::Axis::kPipeline, coords));
  groups.previous_stage = layout::PreviousStageRank(shape, coords);
  groups.next_stage = layout::NextStageRank(shape, coords);
  return groups;
}

}  // namespace cohort::comm
