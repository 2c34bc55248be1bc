#include "worker/comm/mesh_groups.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::comm {
namespace {

struct Dims {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  int RankOf(int d, int t, int p) const { return p * (dp * tp) + d * tp + t; }
};

std::string Describe(const v1::MeshCoordinates& c) {
  return absl::StrCat("(data ", c.data(), ", tensor ", c.tensor(), ", pipeline ", c.pipeline(),
                      ", rank ", c.rank(), ")");
}

// Range and rank-formula checks of one coordinate set.
absl::Status CheckCoordinates(const Dims& dims, const v1::MeshCoordinates& c,
                              const std::string& what) {
  if (c.data() < 0 || c.data() >= dims.dp || c.tensor() < 0 || c.tensor() >= dims.tp ||
      c.pipeline() < 0 || c.pipeline() >= dims.pp) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " coordinates ", Describe(c), " are outside the mesh (data_parallel ",
                     dims.dp, ", tensor_parallel ", dims.tp, ", pipeline_parallel ", dims.pp, ")"));
  }
  const int expected = dims.RankOf(c.data(), c.tensor(), c.pipeline());
  if (c.rank() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " coordinates ", Describe(c), " have rank ", c.rank(),
                     " but the layout gives ", expected,
                     " (rank = pipeline * data_parallel * tensor_parallel + data * "
                     "tensor_parallel + tensor)"));
  }
  return absl::OkStatus();
}

MeshGroup MakeGroup(MeshAxis axis, int group_index, std::vector<int> ranks, int index) {
  MeshGroup group;
  group.axis = axis;
  group.ranks = std::move(ranks);
  group.index = index;
  group.communicator_id = MeshCommunicatorId(axis, group_index);
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
  }
  return "unknown";
}

uint16_t MeshCommunicatorId(MeshAxis axis, int group_index) {
  CHECK(group_index >= 0 && group_index < kMaxGroupsPerAxis) << "group index " << group_index;
  return static_cast<uint16_t>((static_cast<uint16_t>(axis) << 12) |
                               static_cast<uint16_t>(group_index));
}

absl::Status ValidateMesh(const v1::Mesh& mesh) {
  const Dims dims{mesh.data_parallel(), mesh.tensor_parallel(), mesh.pipeline_parallel()};
  if (dims.dp < 1 || dims.tp < 1 || dims.pp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("mesh axis sizes must be >= 1: data_parallel ",
                                                   dims.dp, ", tensor_parallel ", dims.tp,
                                                   ", pipeline_parallel ", dims.pp));
  }
  // In 64 bits: the product of three int32s from the wire may overflow int.
  const int64_t world = int64_t{dims.dp} * dims.tp * dims.pp;
  if (world != mesh.members_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh has ", mesh.members_size(), " members but data_parallel ", dims.dp,
        " x tensor_parallel ", dims.tp, " x pipeline_parallel ", dims.pp, " = ", world));
  }
  // Groups per axis: the product of the other two sizes.
  if (int64_t{dims.dp} * dims.pp > kMaxGroupsPerAxis ||
      int64_t{dims.tp} * dims.pp > kMaxGroupsPerAxis ||
      int64_t{dims.dp} * dims.tp > kMaxGroupsPerAxis) {
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
    if (absl::Status s = CheckCoordinates(dims, c, what); !s.ok()) return s;
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
  const Dims dims{mesh.data_parallel(), mesh.tensor_parallel(), mesh.pipeline_parallel()};
  if (absl::Status s = CheckCoordinates(dims, self, "this rank's"); !s.ok()) return s;
  const int d = self.data();
  const int t = self.tensor();
  const int p = self.pipeline();

  MeshGroups groups;
  groups.rank = self.rank();
  groups.world_size = dims.dp * dims.tp * dims.pp;

  std::vector<int> world(static_cast<size_t>(groups.world_size));
  for (int r = 0; r < groups.world_size; ++r) world[static_cast<size_t>(r)] = r;
  groups.world = MakeGroup(MeshAxis::kWorld, 0, std::move(world), groups.rank);

  std::vector<int> tensor;
  for (int i = 0; i < dims.tp; ++i) tensor.push_back(dims.RankOf(d, i, p));
  groups.tensor = MakeGroup(MeshAxis::kTensor, p * dims.dp + d, std::move(tensor), t);

  std::vector<int> data;
  for (int i = 0; i < dims.dp; ++i) data.push_back(dims.RankOf(i, t, p));
  groups.data = MakeGroup(MeshAxis::kData, p * dims.tp + t, std::move(data), d);

  std::vector<int> pipeline;
  for (int i = 0; i < dims.pp; ++i) pipeline.push_back(dims.RankOf(d, t, i));
  groups.pipeline = MakeGroup(MeshAxis::kPipeline, d * dims.tp + t, std::move(pipeline), p);

  if (p > 0) groups.previous_stage = dims.RankOf(d, t, p - 1);
  if (p + 1 < dims.pp) groups.next_stage = dims.RankOf(d, t, p + 1);
  return groups;
}

}  // namespace cohort::comm
