#include "coordinator/jobs/mesh_planner.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

PlannerWorker Worker(const std::string& id, const std::string& host, int device,
                     uint64_t incarnation = 1) {
  return PlannerWorker{WorkerId(id), Incarnation(incarnation), host, device};
}

// `per_host` workers on each of `hosts` hosts, named "<host>/<device>".
std::vector<PlannerWorker> Hosts(int hosts, int per_host) {
  std::vector<PlannerWorker> workers;
  for (int h = 0; h < hosts; ++h) {
    for (int d = 0; d < per_host; ++d) {
      workers.push_back(Worker(absl::StrCat("h", h, "/", d), absl::StrCat("h", h), d));
    }
  }
  return workers;
}

// Most cases below describe the even split (parallelism.reduction
// TRANSPORT: dp divides the micro-batches); the deterministic reduction's
// uneven shares have tests of their own (UnevenShares*).
PlanRequest Request(int tensor, int pipeline, int min_workers, int max_workers, int micro_batches,
                    std::vector<PlannerWorker> candidates, bool even_shares = true) {
  PlanRequest request;
  request.even_shares = even_shares;
  request.tensor = tensor;
  request.pipeline = pipeline;
  request.min_workers = min_workers;
  request.max_workers = max_workers;
  request.micro_batches = micro_batches;
  request.candidates = std::move(candidates);
  return request;
}

// Structural checks every mesh must pass: shape, ranks 0..n-1 in order,
// coordinates agreeing with the rank, each candidate used at most once.
void ExpectWellFormed(const v1::Mesh& mesh, const PlanRequest& request) {
  const MeshShape shape{mesh.data_parallel(), mesh.tensor_parallel(), mesh.pipeline_parallel()};
  EXPECT_EQ(shape.tensor, request.tensor);
  EXPECT_EQ(shape.pipeline, request.pipeline);
  ASSERT_EQ(mesh.members_size(), shape.world());
  std::map<std::string, const PlannerWorker*> candidates;
  for (const PlannerWorker& w : request.candidates) candidates[w.id.value()] = &w;
  std::set<std::string> seen;
  for (int i = 0; i < mesh.members_size(); ++i) {
    const v1::MeshMember& m = mesh.members(i);
    const v1::MeshCoordinates& c = m.coordinates();
    EXPECT_EQ(c.rank(), i);
    EXPECT_EQ(layout::RankOf(shape, {c.data(), c.tensor(), c.pipeline()}), i);
    EXPECT_TRUE(seen.insert(m.worker_id()).second) << m.worker_id() << " used twice";
    auto it = candidates.find(m.worker_id());
    ASSERT_NE(it, candidates.end()) << m.worker_id() << " is not a candidate";
    EXPECT_EQ(m.host(), it->second->host);
    EXPECT_EQ(m.device_index(), it->second->device_index);
    EXPECT_EQ(m.incarnation(), it->second->incarnation.value());
  }
  // Every data rank trains at least one micro-batch, all of them together.
  ASSERT_EQ(mesh.micro_batches_size(), shape.data);
  int total = 0;
  for (int share : mesh.micro_batches()) {
    EXPECT_GE(share, 1);
    if (request.even_shares) {
      EXPECT_EQ(share, request.micro_batches / shape.data);
    }
    total += share;
  }
  EXPECT_EQ(total, request.micro_batches);
}

// The hosts of every tensor group, keyed by (data, pipeline).
std::map<std::pair<int, int>, std::set<std::string>> GroupHosts(const v1::Mesh& mesh) {
  std::map<std::pair<int, int>, std::set<std::string>> hosts;
  for (const v1::MeshMember& m : mesh.members()) {
    hosts[{m.coordinates().data(), m.coordinates().pipeline()}].insert(m.host());
  }
  return hosts;
}

std::map<std::string, std::tuple<int, int, int>> CoordinatesById(const v1::Mesh& mesh) {
  std::map<std::string, std::tuple<int, int, int>> out;
  for (const v1::MeshMember& m : mesh.members()) {
    out[m.worker_id()] = {m.coordinates().data(), m.coordinates().tensor(),
                          m.coordinates().pipeline()};
  }
  return out;
}

std::vector<PlannerWorker> Without(std::vector<PlannerWorker> workers,
                                   const std::set<std::string>& gone) {
  workers.erase(std::remove_if(workers.begin(), workers.end(),
                               [&](const PlannerWorker& w) { return gone.count(w.id.value()); }),
                workers.end());
  return workers;
}

struct LayoutCase {
  std::string name;
  int tensor, pipeline, min_workers, max_workers, micro_batches, candidates;
  int expected_dp;
};

class LayoutTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(LayoutTest, ChoosesLargestFeasibleDataParallelDegree) {
  const LayoutCase& c = GetParam();
  PlanRequest request = Request(c.tensor, c.pipeline, c.min_workers, c.max_workers, c.micro_batches,
                                Hosts(1, c.candidates));
  absl::StatusOr<MeshShape> shape = MeshPlanner::ChooseShape(request, c.candidates);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->data, c.expected_dp);
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->data_parallel(), c.expected_dp);
  ExpectWellFormed(*mesh, request);
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutTest,
                         ::testing::Values(LayoutCase{"Tp2FourWorkers", 2, 1, 2, 4, 8, 4, 2},
                                           LayoutCase{"Tp2Pp2EightWorkers", 2, 2, 4, 8, 4, 8, 2},
                                           LayoutCase{"MicroBatchesLimitDp", 1, 1, 1, 6, 4, 6, 4},
                                           LayoutCase{"MaxWorkersCap", 1, 1, 1, 4, 8, 10, 4},
                                           LayoutCase{"SpareWorkersUnused", 2, 1, 2, 16, 8, 7, 2},
                                           LayoutCase{"OddMicroBatches", 1, 2, 2, 12, 3, 12, 3},
                                           LayoutCase{"SingleWorker", 1, 1, 1, 1, 1, 1, 1},
                                           LayoutCase{"MinAboveOneReplica", 2, 1, 4, 8, 4, 5, 2}),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) {
                           return info.param.name;
                         });

struct UnevenCase {
  std::string name;
  int tensor, pipeline, min_workers, max_workers, micro_batches, candidates;
  std::vector<int> expected_shares;
};

class UnevenSharesTest : public ::testing::TestWithParam<UnevenCase> {};

// The deterministic reduction: any dp up to the micro-batch count, split
// as evenly as possible with the larger shares first.
TEST_P(UnevenSharesTest, UsesEveryWholeReplicaAndSaysHowItSplits) {
  const UnevenCase& c = GetParam();
  PlanRequest request = Request(c.tensor, c.pipeline, c.min_workers, c.max_workers,
                                c.micro_batches, Hosts(1, c.candidates), /*even_shares=*/false);
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ExpectWellFormed(*mesh, request);
  EXPECT_EQ(mesh->data_parallel(), static_cast<int>(c.expected_shares.size()));
  EXPECT_EQ(std::vector<int>(mesh->micro_batches().begin(), mesh->micro_batches().end()),
            c.expected_shares);
}

INSTANTIATE_TEST_SUITE_P(
    UnevenShares, UnevenSharesTest,
    ::testing::Values(UnevenCase{"ThreeOfFourSurvive", 1, 1, 1, 4, 8, 3, {3, 3, 2}},
                      UnevenCase{"FourOverSix", 1, 1, 1, 8, 6, 4, {2, 2, 1, 1}},
                      UnevenCase{"CappedByTheMicroBatches", 1, 1, 1, 16, 6, 10, {1, 1, 1, 1, 1, 1}},
                      UnevenCase{"Tp2SixWorkers", 2, 1, 2, 8, 4, 7, {2, 1, 1}},
                      UnevenCase{"EvenWhereItDivides", 1, 1, 1, 4, 8, 4, {2, 2, 2, 2}}),
    [](const ::testing::TestParamInfo<UnevenCase>& info) { return info.param.name; });

TEST(MeshPlannerTest, UnevenSharesStillNeedOneMicroBatchPerRank) {
  PlanRequest request = Request(1, 1, 5, 7, 4, Hosts(1, 16), /*even_shares=*/false);
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr("no data parallel degree in [5, 7] (5 to 7 workers with tensor 1 x "
                        "pipeline 1) is at most 4 micro-batches per step"));
}

TEST(MeshPlannerTest, ExactLayoutTp2Pp2) {
  // Two hosts with four devices each, given out of order.
  std::vector<PlannerWorker> workers = {Worker("b2", "hostB", 2), Worker("a0", "hostA", 0),
                                        Worker("b0", "hostB", 0), Worker("a3", "hostA", 3),
                                        Worker("b3", "hostB", 3), Worker("a1", "hostA", 1),
                                        Worker("b1", "hostB", 1), Worker("a2", "hostA", 2)};
  PlanRequest request = Request(2, 2, 4, 8, 4, workers);
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ExpectWellFormed(*mesh, request);
  EXPECT_EQ(mesh->data_parallel(), 2);
  // rank -> (worker, data, tensor, pipeline)
  const std::vector<std::tuple<std::string, int, int, int>> expected = {
      {"a0", 0, 0, 0}, {"a1", 0, 1, 0}, {"a2", 1, 0, 0}, {"a3", 1, 1, 0},
      {"b0", 0, 0, 1}, {"b1", 0, 1, 1}, {"b2", 1, 0, 1}, {"b3", 1, 1, 1}};
  ASSERT_EQ(mesh->members_size(), 8);
  for (int rank = 0; rank < 8; ++rank) {
    const v1::MeshMember& m = mesh->members(rank);
    const auto& [id, data, tensor, pipeline] = expected[rank];
    EXPECT_EQ(m.worker_id(), id) << "rank " << rank;
    EXPECT_EQ(m.coordinates().data(), data) << "rank " << rank;
    EXPECT_EQ(m.coordinates().tensor(), tensor) << "rank " << rank;
    EXPECT_EQ(m.coordinates().pipeline(), pipeline) << "rank " << rank;
    EXPECT_EQ(m.coordinates().rank(), rank);
  }
}

TEST(MeshPlannerTest, DeterministicRegardlessOfCandidateOrder) {
  std::vector<PlannerWorker> workers = Hosts(3, 3);
  PlanRequest forward = Request(2, 1, 2, 8, 4, workers);
  std::reverse(workers.begin(), workers.end());
  PlanRequest backward = Request(2, 1, 2, 8, 4, workers);
  absl::StatusOr<v1::Mesh> a = MeshPlanner::Plan(forward);
  absl::StatusOr<v1::Mesh> b = MeshPlanner::Plan(backward);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
}

struct InfeasibleCase {
  std::string name;
  int tensor, pipeline, min_workers, max_workers, micro_batches, candidates;
  absl::StatusCode code;
  std::string message;
};

class InfeasibleTest : public ::testing::TestWithParam<InfeasibleCase> {};

TEST_P(InfeasibleTest, ExplainsWhy) {
  const InfeasibleCase& c = GetParam();
  PlanRequest request = Request(c.tensor, c.pipeline, c.min_workers, c.max_workers, c.micro_batches,
                                Hosts(1, c.candidates));
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), c.code) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()), HasSubstr(c.message));
  EXPECT_EQ(MeshPlanner::ChooseShape(request, c.candidates).status(), mesh.status());
}

INSTANTIATE_TEST_SUITE_P(
    Infeasible, InfeasibleTest,
    ::testing::Values(
        InfeasibleCase{"TooFewWorkers", 2, 2, 4, 8, 4, 3, absl::StatusCode::kFailedPrecondition,
                       "tensor 2 x pipeline 2 needs at least 4 workers; 3 available"},
        InfeasibleCase{"NoWorkers", 1, 1, 1, 4, 4, 0, absl::StatusCode::kFailedPrecondition,
                       "needs at least 1 workers; 0 available"},
        InfeasibleCase{"MinNeedsDividingDp", 2, 1, 6, 8, 4, 6,
                       absl::StatusCode::kFailedPrecondition,
                       "tensor 2 x pipeline 1 needs at least 8 workers; 6 available"},
        InfeasibleCase{"ReplicaAboveMax", 4, 2, 4, 4, 4, 16, absl::StatusCode::kInvalidArgument,
                       "tensor 4 x pipeline 2 needs 8 workers per replica, more than "
                       "max_workers 4"},
        InfeasibleCase{"NoDpDividesMicroBatches", 1, 1, 5, 7, 4, 16,
                       absl::StatusCode::kInvalidArgument, "no data parallel degree in [5, 7]"},
        InfeasibleCase{"NoDpDividesNamesCount", 2, 1, 6, 6, 4, 16,
                       absl::StatusCode::kInvalidArgument, "divides 4 micro-batches"},
        InfeasibleCase{"ZeroTensor", 0, 1, 1, 4, 4, 4, absl::StatusCode::kInvalidArgument,
                       "parallel degrees must be >= 1"},
        InfeasibleCase{"MaxBelowMin", 1, 1, 4, 2, 4, 4, absl::StatusCode::kInvalidArgument,
                       "min_workers <= max_workers"},
        InfeasibleCase{"ZeroMicroBatches", 1, 1, 1, 4, 0, 4, absl::StatusCode::kInvalidArgument,
                       "micro-batch count must be >= 1"}),
    [](const ::testing::TestParamInfo<InfeasibleCase>& info) { return info.param.name; });

TEST(MeshPlannerTest, DuplicateCandidateIsInvalid) {
  PlanRequest request = Request(1, 1, 1, 4, 4, {Worker("w", "h0", 0), Worker("w", "h1", 0)});
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mesh.status().message()), HasSubstr("w is listed twice"));
}

TEST(MeshPlannerLocalityTest, EachTensorGroupOnOneHost) {
  // Interleaved input so that sorting by id alone would mix the hosts.
  PlanRequest request = Request(2, 1, 2, 4, 4,
                                {Worker("w0", "hostA", 0), Worker("w1", "hostB", 0),
                                 Worker("w2", "hostA", 1), Worker("w3", "hostB", 1)});
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ExpectWellFormed(*mesh, request);
  for (const auto& [group, hosts] : GroupHosts(*mesh)) {
    EXPECT_EQ(hosts.size(), 1u) << "group data=" << group.first;
  }
  EXPECT_EQ(mesh->members(0).worker_id(), "w0");
  EXPECT_EQ(mesh->members(1).worker_id(), "w2");
  EXPECT_EQ(mesh->members(2).worker_id(), "w1");
  EXPECT_EQ(mesh->members(3).worker_id(), "w3");
}

TEST(MeshPlannerLocalityTest, PrefersHostsThatHoldAWholeGroup) {
  // Only hostB and hostD can hold a tp=2 group; four workers are needed.
  PlanRequest request =
      Request(2, 1, 2, 4, 4,
              {Worker("a", "hostA", 0), Worker("b0", "hostB", 0), Worker("b1", "hostB", 1),
               Worker("c", "hostC", 0), Worker("d0", "hostD", 0), Worker("d1", "hostD", 1)});
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ExpectWellFormed(*mesh, request);
  std::vector<std::string> ids;
  for (const auto& m : mesh->members()) ids.push_back(m.worker_id());
  EXPECT_THAT(ids, ::testing::ElementsAre("b0", "b1", "d0", "d1"));
}

TEST(MeshPlannerLocalityTest, MixedHostsStillGiveAValidMesh) {
  // hostA and hostB hold one worker each: one group must span two hosts.
  PlanRequest request = Request(2, 1, 2, 4, 4,
                                {Worker("a", "hostA", 0), Worker("b", "hostB", 0),
                                 Worker("c0", "hostC", 0), Worker("c1", "hostC", 1)});
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ExpectWellFormed(*mesh, request);
  std::map<std::pair<int, int>, std::set<std::string>> groups = GroupHosts(*mesh);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[std::make_pair(0, 0)], (std::set<std::string>{"hostC"}));
  EXPECT_EQ(groups[std::make_pair(1, 0)], (std::set<std::string>{"hostA", "hostB"}));

  // Three hosts of three with tp=2 and dp=4: three local groups, one mixed.
  PlanRequest odd = Request(2, 1, 2, 8, 4, Hosts(3, 3));
  absl::StatusOr<v1::Mesh> odd_mesh = MeshPlanner::Plan(odd);
  ASSERT_TRUE(odd_mesh.ok()) << odd_mesh.status();
  ExpectWellFormed(*odd_mesh, odd);
  int local = 0;
  for (const auto& [group, hosts] : GroupHosts(*odd_mesh)) local += hosts.size() == 1;
  EXPECT_EQ(local, 3);
}

TEST(MeshPlannerReplanTest, SpareFillsTheHoleAndSurvivorsStay) {
  // dp=3 x tp=2 over hosts h0..h2 (two devices each) plus a spare on h1.
  std::vector<PlannerWorker> workers = Hosts(3, 2);
  workers.push_back(Worker("spare", "h1", 7));
  PlanRequest first = Request(2, 1, 2, 6, 3, workers);
  absl::StatusOr<v1::Mesh> before = MeshPlanner::Plan(first);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->data_parallel(), 3);
  auto old_coords = CoordinatesById(*before);
  ASSERT_EQ(old_coords.count("spare"), 0u);

  for (const char* gone_name : {"h1/0", "h0/1"}) {
    const std::string gone = gone_name;
    SCOPED_TRACE(gone);
    PlanRequest again = Request(2, 1, 2, 6, 3, Without(workers, {gone}));
    again.previous = &*before;
    absl::StatusOr<v1::Mesh> after = MeshPlanner::Plan(again);
    ASSERT_TRUE(after.ok()) << after.status();
    ExpectWellFormed(*after, again);
    EXPECT_EQ(after->data_parallel(), 3);
    auto new_coords = CoordinatesById(*after);
    for (const auto& [id, coords] : old_coords) {
      if (id == gone) continue;
      EXPECT_EQ(new_coords.at(id), coords) << id << " moved";
    }
    EXPECT_EQ(new_coords.at("spare"), old_coords.at(gone));
  }
}

TEST(MeshPlannerReplanTest, HoleIsFilledFromTheGroupsHost) {
  // Spares on h0 and h2; a worker of the h2 group dies: the h2 spare replaces it.
  std::vector<PlannerWorker> workers = Hosts(3, 2);
  PlanRequest first = Request(2, 1, 2, 6, 3, workers);
  absl::StatusOr<v1::Mesh> before = MeshPlanner::Plan(first);
  ASSERT_TRUE(before.ok());
  workers = Without(workers, {"h2/0"});
  workers.push_back(Worker("h0/9", "h0", 9));
  workers.push_back(Worker("h2/9", "h2", 9));
  PlanRequest again = Request(2, 1, 2, 6, 3, workers);
  again.previous = &*before;
  absl::StatusOr<v1::Mesh> after = MeshPlanner::Plan(again);
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectWellFormed(*after, again);
  EXPECT_EQ(CoordinatesById(*after).at("h2/9"), CoordinatesById(*before).at("h2/0"));
  for (const auto& [group, hosts] : GroupHosts(*after)) EXPECT_EQ(hosts.size(), 1u);
}

TEST(MeshPlannerReplanTest, ShrinkKeepsSurvivorsInsideTheNewShape) {
  // dp=4 x tp=2 on four hosts; two workers die, six remain, and dp must
  // divide 4 micro-batches: dp=2.
  std::vector<PlannerWorker> workers = Hosts(4, 2);
  PlanRequest first = Request(2, 1, 2, 8, 4, workers);
  absl::StatusOr<v1::Mesh> before = MeshPlanner::Plan(first);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->data_parallel(), 4);
  auto old_coords = CoordinatesById(*before);
  const std::string gone_a = before->members(1).worker_id();  // data 0, tensor 1
  const std::string gone_b = before->members(7).worker_id();  // data 3, tensor 1

  PlanRequest again = Request(2, 1, 2, 8, 4, Without(workers, {gone_a, gone_b}));
  again.previous = &*before;
  absl::StatusOr<v1::Mesh> after = MeshPlanner::Plan(again);
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectWellFormed(*after, again);
  EXPECT_EQ(after->data_parallel(), 2);
  auto new_coords = CoordinatesById(*after);
  int kept = 0;
  for (const auto& [id, coords] : old_coords) {
    if (id == gone_a || id == gone_b || std::get<0>(coords) >= 2) continue;
    EXPECT_EQ(new_coords.at(id), coords) << id << " moved";
    ++kept;
  }
  EXPECT_EQ(kept, 3);
}

TEST(MeshPlannerReplanTest, GrowKeepsSurvivorsAndAddsLocalGroups) {
  std::vector<PlannerWorker> workers = Hosts(2, 2);
  PlanRequest first = Request(2, 1, 2, 16, 4, workers);
  absl::StatusOr<v1::Mesh> before = MeshPlanner::Plan(first);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->data_parallel(), 2);
  // Two new hosts arrive, named so that they sort before the old ones.
  for (const PlannerWorker& w : Hosts(2, 2)) {
    workers.push_back(Worker("new-" + w.id.value(), "a-" + w.host, w.device_index));
  }
  PlanRequest again = Request(2, 1, 2, 16, 4, workers);
  again.previous = &*before;
  absl::StatusOr<v1::Mesh> after = MeshPlanner::Plan(again);
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectWellFormed(*after, again);
  EXPECT_EQ(after->data_parallel(), 4);
  auto new_coords = CoordinatesById(*after);
  for (const auto& [id, coords] : CoordinatesById(*before)) {
    EXPECT_EQ(new_coords.at(id), coords) << id << " moved";
  }
  for (const auto& [group, hosts] : GroupHosts(*after)) EXPECT_EQ(hosts.size(), 1u);
}

TEST(MeshPlannerReplanTest, RestartedWorkerKeepsItsPlaceWithNewIncarnation) {
  std::vector<PlannerWorker> workers = Hosts(2, 2);
  PlanRequest first = Request(2, 1, 2, 4, 4, workers);
  absl::StatusOr<v1::Mesh> before = MeshPlanner::Plan(first);
  ASSERT_TRUE(before.ok());
  workers[3].incarnation = Incarnation(99);
  PlanRequest again = Request(2, 1, 2, 4, 4, workers);
  again.previous = &*before;
  absl::StatusOr<v1::Mesh> after = MeshPlanner::Plan(again);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(CoordinatesById(*after), CoordinatesById(*before));
  for (const auto& m : after->members()) {
    if (m.worker_id() == workers[3].id.value()) {
      EXPECT_EQ(m.incarnation(), 99u);
    }
  }
}

TEST(MeshPlannerScaleTest, TenThousandWorkersOnTwelveHundredFiftyHosts) {
  // tp=8 x pp=5 x dp=250 = 10,000 workers, 8 per host, given in reverse.
  std::vector<PlannerWorker> workers = Hosts(1250, 8);
  std::reverse(workers.begin(), workers.end());
  PlanRequest request = Request(8, 5, 40, 10000, 250, workers);
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_EQ(mesh->data_parallel(), 250);
  ASSERT_EQ(mesh->members_size(), 10000);
  std::vector<bool> rank_seen(10000, false);
  for (const auto& m : mesh->members()) {
    const int rank = m.coordinates().rank();
    ASSERT_TRUE(rank >= 0 && rank < 10000);
    EXPECT_FALSE(rank_seen[rank]);
    rank_seen[rank] = true;
  }
  EXPECT_TRUE(std::all_of(rank_seen.begin(), rank_seen.end(), [](bool b) { return b; }));
  std::map<std::pair<int, int>, std::set<std::string>> groups = GroupHosts(*mesh);
  EXPECT_EQ(groups.size(), 1250u);
  for (const auto& [group, hosts] : groups) ASSERT_EQ(hosts.size(), 1u);

  // One host dies and a spare host arrives: every survivor stays put and the
  // spare host takes over the dead host's group whole.
  workers =
      Without(std::move(workers), {"h7/0", "h7/1", "h7/2", "h7/3", "h7/4", "h7/5", "h7/6", "h7/7"});
  for (int d = 0; d < 8; ++d) workers.push_back(Worker(absl::StrCat("spare/", d), "spare", d));
  PlanRequest again = Request(8, 5, 40, 10000, 250, workers);
  again.previous = &*mesh;
  absl::StatusOr<v1::Mesh> after = MeshPlanner::Plan(again);
  ASSERT_TRUE(after.ok()) << after.status();
  auto old_coords = CoordinatesById(*mesh);
  auto new_coords = CoordinatesById(*after);
  int moved = 0;
  for (const auto& [id, coords] : new_coords) {
    auto it = old_coords.find(id);
    if (it != old_coords.end()) moved += it->second != coords;
  }
  EXPECT_EQ(moved, 0);
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(new_coords.at(absl::StrCat("spare/", d)), old_coords.at(absl::StrCat("h7/", d)));
  }
}

}  // namespace
}  // namespace cohort::coordinator
