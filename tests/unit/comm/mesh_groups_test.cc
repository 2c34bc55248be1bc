// Tests for ComputeMeshGroups / ValidateMesh.
#include "worker/comm/mesh_groups.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::MeshCoordinates Coords(int d, int t, int p, int rank) {
  v1::MeshCoordinates c;
  c.set_data(d);
  c.set_tensor(t);
  c.set_pipeline(p);
  c.set_rank(rank);
  return c;
}

// A valid mesh in rank order, built with the Megatron formula written out
// independently of the code under test.
v1::Mesh MakeMesh(int dp, int tp, int pp) {
  v1::Mesh mesh;
  mesh.set_data_parallel(dp);
  mesh.set_tensor_parallel(tp);
  mesh.set_pipeline_parallel(pp);
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      for (int t = 0; t < tp; ++t) {
        v1::MeshMember* m = mesh.add_members();
        const int rank = p * dp * tp + d * tp + t;
        m->set_worker_id(absl::StrCat("w", rank));
        *m->mutable_coordinates() = Coords(d, t, p, rank);
      }
    }
  }
  return mesh;
}

// dp2 x tp2 x pp2: ranks by (p, d, t):
//   p0: d0 -> 0 1, d1 -> 2 3        p1: d0 -> 4 5, d1 -> 6 7
TEST(MeshGroupsTest, Rank0Of2x2x2) {
  auto groups = ComputeMeshGroups(MakeMesh(2, 2, 2), Coords(0, 0, 0, 0));
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(groups->rank, 0);
  EXPECT_EQ(groups->world_size, 8);
  EXPECT_THAT(groups->tensor.ranks, ElementsAre(0, 1));
  EXPECT_EQ(groups->tensor.index, 0);
  EXPECT_THAT(groups->data.ranks, ElementsAre(0, 2));
  EXPECT_EQ(groups->data.index, 0);
  EXPECT_THAT(groups->pipeline.ranks, ElementsAre(0, 4));
  EXPECT_EQ(groups->pipeline.index, 0);
  EXPECT_FALSE(groups->previous_stage.has_value());
  EXPECT_EQ(groups->next_stage, 4);
  EXPECT_THAT(groups->world.ranks, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(groups->world.index, 0);
}

TEST(MeshGroupsTest, Rank3Of2x2x2) {
  auto groups = ComputeMeshGroups(MakeMesh(2, 2, 2), Coords(1, 1, 0, 3));
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_THAT(groups->tensor.ranks, ElementsAre(2, 3));
  EXPECT_EQ(groups->tensor.index, 1);
  EXPECT_THAT(groups->data.ranks, ElementsAre(1, 3));
  EXPECT_EQ(groups->data.index, 1);
  EXPECT_THAT(groups->pipeline.ranks, ElementsAre(3, 7));
  EXPECT_EQ(groups->pipeline.index, 0);
  EXPECT_FALSE(groups->previous_stage.has_value());
  EXPECT_EQ(groups->next_stage, 7);
}

TEST(MeshGroupsTest, Rank6Of2x2x2) {
  auto groups = ComputeMeshGroups(MakeMesh(2, 2, 2), Coords(1, 0, 1, 6));
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_THAT(groups->tensor.ranks, ElementsAre(6, 7));
  EXPECT_EQ(groups->tensor.index, 0);
  EXPECT_THAT(groups->data.ranks, ElementsAre(4, 6));
  EXPECT_EQ(groups->data.index, 1);
  EXPECT_THAT(groups->pipeline.ranks, ElementsAre(2, 6));
  EXPECT_EQ(groups->pipeline.index, 1);
  EXPECT_EQ(groups->previous_stage, 2);
  EXPECT_FALSE(groups->next_stage.has_value());
  EXPECT_EQ(groups->world.index, 6);
}

TEST(MeshGroupsTest, MiddleStageHasBothNeighbours) {
  // dp1 x tp2 x pp3: stage s of tensor t is rank 2s + t.
  auto groups = ComputeMeshGroups(MakeMesh(1, 2, 3), Coords(0, 1, 1, 3));
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_THAT(groups->pipeline.ranks, ElementsAre(1, 3, 5));
  EXPECT_EQ(groups->pipeline.index, 1);
  EXPECT_EQ(groups->previous_stage, 1);
  EXPECT_EQ(groups->next_stage, 5);
  EXPECT_THAT(groups->tensor.ranks, ElementsAre(2, 3));
  EXPECT_THAT(groups->data.ranks, ElementsAre(3));
}

TEST(MeshGroupsTest, SingleRank) {
  auto groups = ComputeMeshGroups(MakeMesh(1, 1, 1), Coords(0, 0, 0, 0));
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(groups->world_size, 1);
  for (const MeshGroup* g : {&groups->world, &groups->tensor, &groups->data, &groups->pipeline}) {
    EXPECT_THAT(g->ranks, ElementsAre(0)) << MeshAxisName(g->axis);
    EXPECT_EQ(g->index, 0);
  }
  EXPECT_FALSE(groups->previous_stage.has_value());
  EXPECT_FALSE(groups->next_stage.has_value());
}

// Across all ranks: members of one group agree on its id and rank list, and
// different groups have different ids.
TEST(MeshGroupsTest, CommunicatorIdsAgreeWithinAndDifferAcrossGroups) {
  const v1::Mesh mesh = MakeMesh(2, 3, 2);
  std::map<uint16_t, std::vector<int>> ranks_by_id;
  for (const v1::MeshMember& member : mesh.members()) {
    auto groups = ComputeMeshGroups(mesh, member.coordinates());
    ASSERT_TRUE(groups.ok()) << groups.status();
    for (const MeshGroup* g : {&groups->world, &groups->tensor, &groups->data, &groups->pipeline}) {
      EXPECT_EQ(g->ranks[static_cast<size_t>(g->index)], member.coordinates().rank());
      EXPECT_EQ(g->communicator_id >> 12, static_cast<int>(g->axis));
      EXPECT_NE(g->communicator_id, 0xffff);
      auto [it, inserted] = ranks_by_id.emplace(g->communicator_id, g->ranks);
      if (!inserted) {
        EXPECT_EQ(it->second, g->ranks) << "id " << g->communicator_id << " names two groups";
      }
    }
  }
  // 1 world + dp*pp tensor groups + tp*pp data groups + dp*tp pipeline groups.
  EXPECT_EQ(ranks_by_id.size(), 1u + 4u + 6u + 6u);
}

TEST(MeshGroupsTest, CommunicatorIdLayout) {
  EXPECT_EQ(MeshCommunicatorId(MeshAxis::kWorld, 0), 0x0000);
  EXPECT_EQ(MeshCommunicatorId(MeshAxis::kTensor, 5), 0x1005);
  EXPECT_EQ(MeshCommunicatorId(MeshAxis::kData, 0xfff), 0x2fff);
  EXPECT_EQ(MeshCommunicatorId(MeshAxis::kPipeline, 1), 0x3001);
}

TEST(MeshGroupsTest, MembersOutOfRankOrderAreAccepted) {
  v1::Mesh mesh = MakeMesh(2, 1, 1);
  mesh.mutable_members()->SwapElements(0, 1);
  auto groups = ComputeMeshGroups(mesh, Coords(1, 0, 0, 1));
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_THAT(groups->data.ranks, ElementsAre(0, 1));
  EXPECT_EQ(groups->data.index, 1);
}

void ExpectInvalid(const v1::Mesh& mesh, const std::string& message_part) {
  absl::Status status = ValidateMesh(mesh);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(message_part));
  EXPECT_EQ(ComputeMeshGroups(mesh, Coords(0, 0, 0, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MeshGroupsTest, ValidMeshesPass) {
  EXPECT_TRUE(ValidateMesh(MakeMesh(1, 1, 1)).ok());
  EXPECT_TRUE(ValidateMesh(MakeMesh(2, 2, 2)).ok());
  EXPECT_TRUE(ValidateMesh(MakeMesh(3, 1, 4)).ok());
}

TEST(MeshGroupsTest, RejectsZeroAxis) {
  v1::Mesh mesh = MakeMesh(1, 1, 1);
  mesh.set_tensor_parallel(0);
  ExpectInvalid(mesh, "must be >= 1");
}

TEST(MeshGroupsTest, RejectsMissingMember) {
  v1::Mesh mesh = MakeMesh(2, 2, 1);
  mesh.mutable_members()->RemoveLast();
  ExpectInvalid(mesh, "has 3 members");
}

TEST(MeshGroupsTest, RejectsDuplicateCoordinates) {
  v1::Mesh mesh = MakeMesh(2, 2, 1);
  *mesh.mutable_members(3)->mutable_coordinates() = Coords(0, 1, 0, 1);
  ExpectInvalid(mesh, "both hold coordinates");
}

TEST(MeshGroupsTest, RejectsRankNotMatchingLayout) {
  v1::Mesh mesh = MakeMesh(2, 2, 1);
  // Swap the ranks of (d0,t1) and (d1,t0): coordinates are all covered, but
  // the ranks are those of a data-major layout.
  mesh.mutable_members(1)->mutable_coordinates()->set_rank(2);
  mesh.mutable_members(2)->mutable_coordinates()->set_rank(1);
  ExpectInvalid(mesh, "but the layout gives");
}

TEST(MeshGroupsTest, RejectsCoordinateOutOfRange) {
  v1::Mesh mesh = MakeMesh(1, 2, 1);
  *mesh.mutable_members(1)->mutable_coordinates() = Coords(0, 2, 0, 2);
  ExpectInvalid(mesh, "outside the mesh");
}

TEST(MeshGroupsTest, RejectsMemberWithoutCoordinates) {
  v1::Mesh mesh = MakeMesh(1, 2, 1);
  mesh.mutable_members(1)->clear_coordinates();
  ExpectInvalid(mesh, "has no coordinates");
}

TEST(MeshGroupsTest, RejectsTooManyGroups) {
  // 4097 tensor groups of size 1 would need a 13-bit index; building the
  // members is skipped because the size check comes first.
  v1::Mesh mesh;
  mesh.set_data_parallel(4097);
  mesh.set_tensor_parallel(1);
  mesh.set_pipeline_parallel(1);
  for (int r = 0; r < 4097; ++r) {
    *mesh.add_members()->mutable_coordinates() = Coords(r, 0, 0, r);
  }
  ExpectInvalid(mesh, "mesh too large");
}

TEST(MeshGroupsTest, RejectsSelfNotInMesh) {
  const v1::Mesh mesh = MakeMesh(2, 1, 1);
  auto out_of_range = ComputeMeshGroups(mesh, Coords(2, 0, 0, 2));
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  auto wrong_rank = ComputeMeshGroups(mesh, Coords(1, 0, 0, 0));
  EXPECT_EQ(wrong_rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong_rank.status().message()), HasSubstr("this rank's"));
}

}  // namespace
}  // namespace cohort::comm
