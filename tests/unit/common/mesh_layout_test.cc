// The layout library (common/layout/mesh_layout.h) against brute-force
// enumeration, and the coordinator's plan against the groups a worker
// derives from it, for every (dp, tp, pp) of up to 64 ranks (issue 22).

#include "common/layout/mesh_hosts.h"
#include "common/layout/mesh_layout.h"
#include "common/layout/mesh_proto.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/mesh_planner.h"
#include "gtest/gtest.h"
#include "worker/comm/mesh_groups.h"

namespace cohort::layout {
namespace {

constexpr int kMaxRanks = 64;

std::vector<MeshShape> AllShapes() {
  std::vector<MeshShape> shapes;
  for (int dp = 1; dp <= kMaxRanks; ++dp) {
    for (int tp = 1; dp * tp <= kMaxRanks; ++tp) {
      for (int pp = 1; dp * tp * pp <= kMaxRanks; ++pp) shapes.push_back({dp, tp, pp});
    }
  }
  return shapes;
}

std::string Name(const MeshShape& s) {
  return absl::StrCat("dp ", s.data, " tp ", s.tensor, " pp ", s.pipeline);
}

// Megatron's order, written as the nested loops that define it.
std::vector<MeshCoords> Enumerate(const MeshShape& shape) {
  std::vector<MeshCoords> by_rank;
  for (int p = 0; p < shape.pipeline; ++p) {
    for (int d = 0; d < shape.data; ++d) {
      for (int t = 0; t < shape.tensor; ++t) by_rank.push_back({d, t, p});
    }
  }
  return by_rank;
}

TEST(MeshLayoutTest, RanksAndCoordinatesAreTheEnumerationOrder) {
  const std::vector<MeshShape> shapes = AllShapes();
  ASSERT_GT(shapes.size(), 500u);
  for (const MeshShape& shape : shapes) {
    const std::vector<MeshCoords> by_rank = Enumerate(shape);
    ASSERT_EQ(static_cast<int>(by_rank.size()), shape.world()) << Name(shape);
    for (int rank = 0; rank < shape.world(); ++rank) {
      const MeshCoords& c = by_rank[static_cast<size_t>(rank)];
      ASSERT_EQ(RankOf(shape, c), rank) << Name(shape);
      ASSERT_EQ(CoordsOf(shape, rank), c) << Name(shape) << " rank " << rank;
      ASSERT_TRUE(InMesh(shape, c));
    }
    EXPECT_FALSE(InMesh(shape, {shape.data, 0, 0}));
    EXPECT_FALSE(InMesh(shape, {0, -1, 0}));
    EXPECT_FALSE(InMesh(shape, {0, 0, shape.pipeline}));
  }
}

TEST(MeshLayoutTest, TensorFastestThenDataThenPipeline) {
  const MeshShape shape{3, 2, 2};
  EXPECT_EQ(shape.world(), 12);
  EXPECT_EQ(RankOf(shape, {0, 1, 0}), 1);
  EXPECT_EQ(RankOf(shape, {1, 0, 0}), 2);
  EXPECT_EQ(RankOf(shape, {2, 1, 0}), 5);
  EXPECT_EQ(RankOf(shape, {0, 0, 1}), 6);
  EXPECT_EQ(RankOf(shape, {2, 1, 1}), 11);
}

TEST(MeshLayoutTest, GroupsAreTheRanksThatShareTheOtherTwoCoordinates) {
  for (const MeshShape& shape : AllShapes()) {
    const std::vector<MeshCoords> by_rank = Enumerate(shape);
    for (const Axis axis : {Axis::kTensor, Axis::kData, Axis::kPipeline}) {
      std::map<int, std::vector<int>> ranks_of_group;  // group index -> ranks
      for (int rank = 0; rank < shape.world(); ++rank) {
        const MeshCoords& self = by_rank[static_cast<size_t>(rank)];
        const AxisGroup group = GroupOf(shape, axis, self);
        // Brute force: every rank whose other coordinates equal self's, by
        // its coordinate on the axis.
        std::vector<std::pair<int, int>> expected;
        for (int other = 0; other < shape.world(); ++other) {
          const MeshCoords& c = by_rank[static_cast<size_t>(other)];
          const bool same = (axis == Axis::kTensor || c.tensor == self.tensor) &&
                            (axis == Axis::kData || c.data == self.data) &&
                            (axis == Axis::kPipeline || c.pipeline == self.pipeline);
          if (same) expected.push_back({AxisCoordinate(c, axis), other});
        }
        std::sort(expected.begin(), expected.end());
        std::vector<int> expected_ranks;
        for (const auto& [coordinate, r] : expected) expected_ranks.push_back(r);
        ASSERT_EQ(group.ranks, expected_ranks) << Name(shape) << " " << AxisName(axis);
        ASSERT_EQ(static_cast<int>(group.ranks.size()), AxisSize(shape, axis));
        ASSERT_EQ(group.ranks[static_cast<size_t>(group.index)], rank);
        ASSERT_GE(group.group_index, 0);
        ASSERT_LT(group.group_index, GroupsOnAxis(shape, axis));
        auto [it, inserted] = ranks_of_group.emplace(group.group_index, group.ranks);
        // Every member of a group computes the same index, and distinct
        // groups get distinct indices.
        ASSERT_EQ(it->second, group.ranks) << Name(shape) << " " << AxisName(axis);
      }
      EXPECT_EQ(static_cast<int>(ranks_of_group.size()), GroupsOnAxis(shape, axis));
    }
  }
}

TEST(MeshLayoutTest, GroupMemberInvertsTheGroupIndexAndTheAxisCoordinate) {
  for (const MeshShape& shape : AllShapes()) {
    for (const Axis axis : {Axis::kTensor, Axis::kData, Axis::kPipeline}) {
      for (int rank = 0; rank < shape.world(); ++rank) {
        const MeshCoords self = CoordsOf(shape, rank);
        const int index = GroupIndex(shape, axis, self);
        ASSERT_EQ(index, GroupOf(shape, axis, self).group_index) << Name(shape);
        ASSERT_EQ(GroupMember(shape, axis, index, AxisCoordinate(self, axis)), self)
            << Name(shape) << " " << AxisName(axis) << " rank " << rank;
      }
    }
  }
}

TEST(MeshLayoutTest, TheSplitsTheRuleMakesFitAndOthersAreToldApart) {
  for (int micro_batches = 1; micro_batches <= 12; ++micro_batches) {
    for (int dp = 1; dp <= micro_batches; ++dp) {
      const std::vector<int> shares = MicroBatchShares(micro_batches, dp);
      EXPECT_TRUE(SharesFit(shares, micro_batches, /*even_shares=*/false));
      EXPECT_EQ(SharesFit(shares, micro_batches, /*even_shares=*/true),
                MicroBatchesFit(micro_batches, dp, /*even_shares=*/true));
    }
  }
  EXPECT_FALSE(SharesFit({}, 0, false));
  EXPECT_FALSE(SharesFit({3, 3}, 8, false));     // does not sum
  EXPECT_FALSE(SharesFit({8, 0}, 8, false));     // a rank without one
  EXPECT_FALSE(SharesFit({9, -1}, 8, false));
  EXPECT_TRUE(SharesFit({2, 6}, 8, false));      // uneven the other way: still a split
  EXPECT_FALSE(SharesFit({2, 6}, 8, true));
}

TEST(MeshLayoutTest, TheWiresMeshConvertsOnceWithUnsetDegreesAsOne) {
  v1::Mesh mesh;
  EXPECT_EQ(ShapeOf(mesh), (MeshShape{1, 1, 1}));
  mesh.set_data_parallel(3);
  mesh.set_pipeline_parallel(2);
  EXPECT_EQ(ShapeOf(mesh), (MeshShape{3, 1, 2}));
  EXPECT_EQ(DegreesText(mesh), "3x0x2");
  v1::RecoveryPlan plan;
  plan.set_source_tensor_parallel(4);
  EXPECT_EQ(SourceShapeOf(plan), (MeshShape{1, 4, 1}));
  const MeshShape shape{3, 2, 2};
  for (int rank = 0; rank < shape.world(); ++rank) {
    v1::MeshCoordinates wire;
    SetCoordinates(shape, CoordsOf(shape, rank), &wire);
    EXPECT_EQ(wire.rank(), rank);
    EXPECT_EQ(CoordsOf(wire), CoordsOf(shape, rank));
  }
}

TEST(MeshLayoutTest, NeighbouringStagesAreThePipelineGroupsNeighbours) {
  for (const MeshShape& shape : AllShapes()) {
    for (int rank = 0; rank < shape.world(); ++rank) {
      const MeshCoords c = CoordsOf(shape, rank);
      const AxisGroup pipeline = GroupOf(shape, Axis::kPipeline, c);
      const std::optional<int> previous = PreviousStageRank(shape, c);
      const std::optional<int> next = NextStageRank(shape, c);
      ASSERT_EQ(previous.has_value(), c.pipeline > 0);
      ASSERT_EQ(next.has_value(), c.pipeline + 1 < shape.pipeline);
      if (previous) {
        ASSERT_EQ(*previous, pipeline.ranks[static_cast<size_t>(c.pipeline - 1)]);
      }
      if (next) {
        ASSERT_EQ(*next, pipeline.ranks[static_cast<size_t>(c.pipeline + 1)]);
      }
    }
  }
}

TEST(MeshLayoutTest, DataShardsTileTheParametersOnAlignedBoundaries) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, kShardAlignment, kShardAlignment * 3 + 7,
                   size_t{124439808}}) {
    for (int dp = 1; dp <= kMaxRanks; ++dp) {
      size_t covered = 0;
      const size_t padded = PaddedShardedSize(n, dp);
      ASSERT_EQ(padded % (static_cast<size_t>(dp) * kShardAlignment), 0u);
      ASSERT_GE(padded, std::max<size_t>(n, 1));
      for (int d = 0; d < dp; ++d) {
        const ShardRange r = DataShardRange(n, dp, d);
        ASSERT_EQ(r.begin, covered) << n << " over " << dp << ": rank " << d;
        ASSERT_LE(r.end, n);
        if (r.end < n) {
          ASSERT_EQ(r.end % kShardAlignment, 0u);
        }
        ASSERT_LE(r.size(), padded / static_cast<size_t>(dp));
        covered = r.end;
      }
      ASSERT_EQ(covered, n) << n << " over " << dp;
    }
  }
}

TEST(MeshLayoutTest, OptimizerCopiesSitOnDistinctDataRanksAndInvert) {
  EXPECT_EQ(OptimizerCopies(false, 2, 4), 4) << "without ZeRO-1 every data rank holds it all";
  EXPECT_EQ(OptimizerCopies(true, 2, 4), 2);
  EXPECT_EQ(OptimizerCopies(true, 8, 3), 3) << "clamped to the data degree";
  EXPECT_EQ(OptimizerCopies(true, 0, 3), 1);
  // Any host pattern: hosts drawn from a small alphabet per data rank.
  for (int dp = 1; dp <= kMaxRanks; ++dp) {
    for (int pattern = 0; pattern < 16; ++pattern) {
      std::vector<std::string> hosts;
      // Runs of 1 + pattern / 4 consecutive ranks, over 1 + pattern % 4 hosts.
      for (int d = 0; d < dp; ++d) {
        hosts.push_back(std::string(1, static_cast<char>('a' + (d / (1 + pattern / 4) + pattern) %
                                                                   (1 + pattern % 4))));
      }
      const CopyRing ring = pattern == 0 ? CopyRing(dp) : CopyRing::AcrossHosts(hosts);
      ASSERT_EQ(ring.size(), dp);
      for (int replicas = 1; replicas <= 8; ++replicas) {
        const int copies = OptimizerCopies(true, replicas, dp);
        for (int owner = 0; owner < dp; ++owner) {
          std::set<int> holders;
          for (int copy = 0; copy < copies; ++copy) {
            const int holder = ring.Holder(owner, copy);
            ASSERT_GE(holder, 0);
            ASSERT_LT(holder, dp);
            ASSERT_EQ(ring.Owner(holder, copy), owner);
            holders.insert(holder);
          }
          ASSERT_EQ(ring.Holder(owner, 0), owner);
          ASSERT_EQ(static_cast<int>(holders.size()), copies) << "dp " << dp << " owner " << owner;
        }
      }
    }
  }
}

TEST(MeshLayoutTest, TheCopyRingIsTheIdentityOnOneHostAndCrossesHostsWhereItCan) {
  EXPECT_EQ(CopyRing(4).order(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(CopyRing::AcrossHosts({"a", "a", "a"}).order(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(CopyRing::AcrossHosts({"a", "b", "c"}).order(), (std::vector<int>{0, 1, 2}));
  // Two hosts of two: every next position is on the other host.
  const CopyRing two = CopyRing::AcrossHosts({"a", "a", "b", "b"});
  EXPECT_EQ(two.order(), (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(two.Holder(0, 1), 2);
  EXPECT_EQ(two.Holder(3, 1), 0);
  EXPECT_EQ(two.Owner(1, 1), 2);
  // Hosts in order of their first rank, whatever their names.
  EXPECT_EQ(CopyRing::AcrossHosts({"z", "a", "z", "a", "z", "a"}).order(),
            (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(CopyRing::AcrossHosts({"b", "b", "b", "a", "a", "c"}).order(),
            (std::vector<int>{0, 3, 5, 1, 4, 2}));
  // With equal hosts, every copy of a piece sits on another host than the
  // owner's as long as copies <= hosts.
  std::vector<std::string> hosts;
  for (int h = 0; h < 4; ++h) {
    for (int k = 0; k < 3; ++k) hosts.push_back(std::string(1, 'a' + h));
  }
  const CopyRing spread = CopyRing::AcrossHosts(hosts);
  for (int owner = 0; owner < 12; ++owner) {
    std::set<std::string> on;
    for (int copy = 0; copy < 4; ++copy) on.insert(hosts[static_cast<size_t>(spread.Holder(owner, copy))]);
    EXPECT_EQ(on.size(), 4u) << "owner " << owner;
  }
}

TEST(MeshLayoutTest, EachDataGroupsCopyRingFollowsItsMembersHosts) {
  // dp 4 x tp 2 over hosts a (data 0, 1) and b (data 2, 3), except that
  // tensor rank 1 of data rank 3 is missing (a hole: a host of its own).
  v1::Mesh mesh;
  mesh.set_data_parallel(4);
  mesh.set_tensor_parallel(2);
  mesh.set_pipeline_parallel(1);
  for (int d = 0; d < 4; ++d) {
    for (int t = 0; t < 2; ++t) {
      if (d == 3 && t == 1) continue;
      v1::MeshMember* m = mesh.add_members();
      m->set_host(d < 2 ? "a" : "b");
      m->mutable_coordinates()->set_data(d);
      m->mutable_coordinates()->set_tensor(t);
      m->mutable_coordinates()->set_rank(d * 2 + t);
    }
  }
  const std::vector<CopyRing> rings = CopyRingsOf(mesh);
  ASSERT_EQ(rings.size(), 2u);
  EXPECT_EQ(rings[0].order(), (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(rings[1].order(), (std::vector<int>{0, 2, 3, 1}));
  EXPECT_EQ(CopyRingOf(mesh, {1, 1, 0}), rings[1]);
}

// What the coordinator plans and what each worker derives from the plan
// describe the same mesh: every member's groups exist, and its tensor,
// data and pipeline groups hold exactly the planned members that share the
// other two coordinates.
TEST(MeshLayoutTest, TheCoordinatorsPlanAndTheWorkersGroupsAgree) {
  for (const MeshShape& shape : AllShapes()) {
    coordinator::PlanRequest request;
    request.tensor = shape.tensor;
    request.pipeline = shape.pipeline;
    request.min_workers = request.max_workers = shape.world();
    request.micro_batches = shape.data;
    for (int w = 0; w < shape.world(); ++w) {
      request.candidates.push_back({WorkerId(absl::StrCat("w", w)), Incarnation(1),
                                    absl::StrCat("host-", w / 8), w % 8});
    }
    absl::StatusOr<v1::Mesh> mesh = coordinator::MeshPlanner::Plan(request);
    ASSERT_TRUE(mesh.ok()) << Name(shape) << ": " << mesh.status();
    ASSERT_EQ(mesh->data_parallel(), shape.data) << Name(shape);
    ASSERT_TRUE(comm::ValidateMesh(*mesh).ok()) << Name(shape);
    std::map<int, MeshCoords> planned;  // rank -> coordinates
    for (const v1::MeshMember& m : mesh->members()) {
      const v1::MeshCoordinates& c = m.coordinates();
      planned[c.rank()] = {c.data(), c.tensor(), c.pipeline()};
    }
    for (const v1::MeshMember& m : mesh->members()) {
      absl::StatusOr<comm::MeshGroups> groups = comm::ComputeMeshGroups(*mesh, m.coordinates());
      ASSERT_TRUE(groups.ok()) << Name(shape) << ": " << groups.status();
      const MeshCoords self = planned[m.coordinates().rank()];
      for (const auto& [group, axis] :
           {std::pair{&groups->tensor, Axis::kTensor}, std::pair{&groups->data, Axis::kData},
            std::pair{&groups->pipeline, Axis::kPipeline}}) {
        ASSERT_EQ(static_cast<int>(group->ranks.size()), AxisSize(shape, axis));
        for (size_t i = 0; i < group->ranks.size(); ++i) {
          const MeshCoords c = planned[group->ranks[i]];
          ASSERT_EQ(AxisCoordinate(c, axis), static_cast<int>(i)) << Name(shape);
          for (const Axis other : {Axis::kTensor, Axis::kData, Axis::kPipeline}) {
            if (other != axis) {
              ASSERT_EQ(AxisCoordinate(c, other), AxisCoordinate(self, other));
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cohort::layout
