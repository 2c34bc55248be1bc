// Peer recovery's transfers, in process: the source generation's ranks hold
// synthetic state (each value a function of its tensor and global index),
// some of them are lost, the coordinator's planner picks sources, and every
// participant runs its transfers on a thread over an in-memory communicator.
// Every new rank must end with bitwise the state a checkpoint load of the
// same step would have given it.

#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/jobs/recovery_planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/hub_communicator.h"
#include "worker/checkpoint/live_transfer.h"
#include "worker/checkpoint/state_transfer.h"
#include "worker/train/data_parallel.h"

namespace cohort::checkpoint {
namespace {

using ::cohort::testing::Hub;
using ::cohort::testing::HubCommunicator;

const model::GptConfig kSmall{
    .layers = 4, .heads = 4, .width = 64, .vocab_size = 256, .context_length = 32};

float Value(StateKind kind, int id, size_t i) {
  uint64_t h = (static_cast<uint64_t>(kind) * 7919u + static_cast<uint64_t>(id)) * 2654435761u + i;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return static_cast<float>(h % 100003) * 1e-4f;
}

// A rank's arena of `kind` for `table`, from the synthetic global tensors.
std::vector<float> Arena(const model::ParameterTable& table, StateKind kind) {
  const model::ParameterTable whole(kSmall);
  std::vector<float> arena(table.num_params());
  for (const model::ParameterInfo& info : table.tensors()) {
    if (!info.present()) continue;
    std::vector<float> global(whole[info.id].numel);
    for (size_t i = 0; i < global.size(); ++i) global[i] = Value(kind, info.id, i);
    ExtractShard(info, global.data(), arena.data() + info.offset);
  }
  return arena;
}

v1::Mesh MeshOf(const StateLayout& l, const std::string& prefix) {
  v1::Mesh mesh;
  mesh.set_data_parallel(l.shape.data);
  mesh.set_tensor_parallel(l.shape.tensor);
  mesh.set_pipeline_parallel(l.shape.pipeline);
  for (int r = 0; r < l.world(); ++r) {
    const RankPosition p = PositionOf(l, r);
    v1::MeshMember* m = mesh.add_members();
    m->set_worker_id(absl::StrCat(prefix, r));
    m->mutable_coordinates()->set_rank(r);
    m->mutable_coordinates()->set_data(p.coords.data);
    m->mutable_coordinates()->set_tensor(p.coords.tensor);
    m->mutable_coordinates()->set_pipeline(p.coords.pipeline);
  }
  return mesh;
}

struct Case {
  std::string name;
  StateLayout source;
  std::set<int> lost;  // source ranks
  StateLayout next;
  // New rank -> source rank that continues there (the rest are new workers).
  std::map<int, int> continuing;
};

class LiveTransferTest : public ::testing::TestWithParam<Case> {};

TEST_P(LiveTransferTest, EveryNewRankGetsBitwiseTheStateItNeeds) {
  const Case& c = GetParam();
  const v1::Mesh source_mesh = MeshOf(c.source, "s");
  v1::Mesh next_mesh = MeshOf(c.next, "n");
  for (const auto& [q, r] : c.continuing) {
    next_mesh.mutable_members(q)->set_worker_id(absl::StrCat("s", r));
  }
  coordinator::RecoveryInput input;
  input.source = coordinator::StateSource{Generation(1), source_mesh, c.source.zero1,
                                          c.source.optimizer_replicas};
  for (int r = 0; r < c.source.world(); ++r) {
    if (!c.lost.contains(r)) input.holders[absl::StrCat("s", r)] = 7;
  }
  input.next_mesh = next_mesh;
  const v1::RecoveryPlan plan = coordinator::PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  const std::vector<Transfer> transfers = PlanTransfers(kSmall, plan, c.next, 3000);
  const std::vector<std::vector<int>> rounds = ScheduleRounds(transfers);
  // A rank that continues takes the weights its shard held from itself.
  for (const auto& [q, r] : c.continuing) {
    const model::ParameterTable held(kSmall, PositionOf(c.source, r).model());
    for (const Transfer& t : transfers) {
      if (t.to != q || t.kind != StateKind::kParam) continue;
      const model::ParameterInfo& info = held[t.tensor];
      if (!info.present() || Intersect(t.region, Box{info.box_start, info.box_extent}) != t.region) {
        continue;
      }
      EXPECT_EQ(t.from, q) << "new rank " << q << " receives weights of " << info.name
                           << " it holds, from participant " << t.from;
    }
  }
  const int participants = c.next.world() + plan.donors_size();

  // Source state of every surviving participant.
  std::map<int, int> source_rank_of;  // participant -> source rank
  for (const auto& [q, r] : c.continuing) source_rank_of[q] = r;
  for (int i = 0; i < plan.donors_size(); ++i) {
    source_rank_of[c.next.world() + i] = plan.donors(i).source_coordinates().rank();
  }
  struct Held {
    std::unique_ptr<model::ParameterTable> table;
    std::vector<float> params, m, v;
    std::vector<std::vector<float>> mirror_m, mirror_v;
    SourceState state;
  };
  std::map<int, Held> held;
  for (const auto& [participant, r] : source_rank_of) {
    Held& h = held[participant];
    const RankPosition pos = PositionOf(c.source, r);
    h.table = std::make_unique<model::ParameterTable>(kSmall, pos.model());
    const size_t n = h.table->num_params();
    h.params = Arena(*h.table, StateKind::kParam);
    std::vector<float> m = Arena(*h.table, StateKind::kAdamM), v = Arena(*h.table, StateKind::kAdamV);
    const layout::ShardRange own = layout::DataShardRange(n, c.source.shape.data, pos.coords.data);
    const ArenaRange optimizer = c.source.zero1 ? ArenaRange{own.begin, own.end} : ArenaRange{0, n};
    h.m.assign(m.begin() + optimizer.begin, m.begin() + optimizer.end);
    h.v.assign(v.begin() + optimizer.begin, v.begin() + optimizer.end);
    h.state = SourceState{h.table.get(), r, c.source, h.params.data(), h.m.data(), h.v.data(),
                          optimizer, {}};
    if (c.source.zero1) {
      for (int j = 1; j < c.source.optimizer_replicas; ++j) {
        const int owner = (pos.coords.data - j + c.source.shape.data) % c.source.shape.data;
        const layout::ShardRange range = layout::DataShardRange(n, c.source.shape.data, owner);
        h.mirror_m.emplace_back(m.begin() + range.begin, m.begin() + range.end);
        h.mirror_v.emplace_back(v.begin() + range.begin, v.begin() + range.end);
      }
      for (size_t j = 0; j < h.mirror_m.size(); ++j) {
        const int owner = (pos.coords.data - static_cast<int>(j) - 1 + c.source.shape.data) % c.source.shape.data;
        const layout::ShardRange range = layout::DataShardRange(n, c.source.shape.data, owner);
        h.state.mirrors.push_back(SourceState::Mirror{owner, h.mirror_m[j].data(),
                                                      h.mirror_v[j].data(),
                                                      ArenaRange{range.begin, range.end}});
      }
    }
  }
  // Destinations, NaN-filled.
  struct Dest {
    std::unique_ptr<model::ParameterTable> table;
    std::vector<float> params, m, v;
    ArenaRange optimizer;
  };
  std::vector<Dest> dests(static_cast<size_t>(c.next.world()));
  for (int q = 0; q < c.next.world(); ++q) {
    const RankPosition pos = PositionOf(c.next, q);
    Dest& d = dests[static_cast<size_t>(q)];
    d.table = std::make_unique<model::ParameterTable>(kSmall, pos.model());
    const size_t n = d.table->num_params();
    const layout::ShardRange own = layout::DataShardRange(n, c.next.shape.data, pos.coords.data);
    d.optimizer = c.next.zero1 ? ArenaRange{own.begin, own.end} : ArenaRange{0, n};
    d.params.assign(n, NAN);
    d.m.assign(d.optimizer.end - d.optimizer.begin, NAN);
    d.v.assign(d.optimizer.end - d.optimizer.begin, NAN);
  }
  Hub hub;
  std::vector<absl::Status> results(static_cast<size_t>(participants));
  std::vector<TransferStats> stats(static_cast<size_t>(participants));
  std::vector<std::thread> threads;
  for (int p = 0; p < participants; ++p) {
    threads.emplace_back([&, p] {
      HubCommunicator world(&hub, p, participants);
      const SourceState* source = held.contains(p) ? &held.at(p).state : nullptr;
      std::optional<DestinationState> destination;
      if (p < c.next.world()) {
        Dest& d = dests[static_cast<size_t>(p)];
        destination = DestinationState{d.table.get(),
                                       StateBuffers{d.params.data(), d.m.data(), d.v.data(), d.optimizer}};
      }
      results[static_cast<size_t>(p)] =
          RunTransfers(&world, p, transfers, rounds, source, destination ? &*destination : nullptr,
                       absl::Seconds(20), &stats[static_cast<size_t>(p)]);
    });
  }
  for (std::thread& t : threads) t.join();
  int64_t moved = 0, copied = 0;
  for (int p = 0; p < participants; ++p) {
    ASSERT_TRUE(results[static_cast<size_t>(p)].ok()) << "participant " << p << ": "
                                                      << results[static_cast<size_t>(p)];
    moved += stats[static_cast<size_t>(p)].received_bytes;
    copied += stats[static_cast<size_t>(p)].copied_bytes;
  }
  for (int q = 0; q < c.next.world(); ++q) {
    const Dest& d = dests[static_cast<size_t>(q)];
    const std::vector<float> params = Arena(*d.table, StateKind::kParam);
    const std::vector<float> m = Arena(*d.table, StateKind::kAdamM);
    const std::vector<float> v = Arena(*d.table, StateKind::kAdamV);
    ASSERT_EQ(std::memcmp(d.params.data(), params.data(), params.size() * 4), 0) << "rank " << q;
    for (size_t i = 0; i < d.m.size(); ++i) {
      if (std::memcmp(&d.m[i], &m[d.optimizer.begin + i], 4) != 0) {
        const model::ParameterInfo& info = d.table->TensorAt(d.optimizer.begin + i);
        ADD_FAILURE() << "rank " << q << " adam_m element " << d.optimizer.begin + i << " ("
                      << info.name << " +" << d.optimizer.begin + i - info.offset << "): got "
                      << d.m[i] << " want " << m[d.optimizer.begin + i];
        break;
      }
    }
    ASSERT_EQ(std::memcmp(d.m.data(), m.data() + d.optimizer.begin, d.m.size() * 4), 0) << q;
    ASSERT_EQ(std::memcmp(d.v.data(), v.data() + d.optimizer.begin, d.v.size() * 4), 0) << q;
  }
  std::printf("%-24s %zu transfers in %zu rounds, %d donors: %.2f MB sent, %.2f MB copied locally\n",
              c.name.c_str(), transfers.size(), rounds.size(), plan.donors_size(), moved / 1e6,
              copied / 1e6);
}

INSTANTIATE_TEST_SUITE_P(
    Recoveries, LiveTransferTest,
    ::testing::Values(
        Case{"SpareReplacesDataRank", {{4, 1, 1}, true, 2}, {2}, {{4, 1, 1}, true, 2},
             {{0, 0}, {1, 1}, {3, 3}}},
        Case{"ShrinkDp4ToDp2", {{4, 1, 1}, true, 2}, {1}, {{2, 1, 1}, true, 2}, {{0, 0}, {1, 2}}},
        Case{"TensorMemberLost", {{2, 2, 1}, false, 1}, {1}, {{1, 2, 1}, false, 1}, {{0, 0}, {1, 3}}},
        Case{"PipelineToTensor", {{2, 1, 2}, true, 2}, {3}, {{2, 2, 1}, true, 2},
             {{0, 0}, {1, 2}, {2, 1}}},
        Case{"GrowDp2ToDp4", {{2, 1, 1}, true, 2}, {}, {{4, 1, 1}, true, 2}, {{0, 0}, {2, 1}}},
        Case{"Mixed222To122", {{2, 2, 2}, true, 2}, {0, 6}, {{1, 2, 2}, false, 1},
             {{0, 2}, {1, 1}, {2, 4}, {3, 7}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(ScheduleRoundsTest, EachParticipantSendsAndReceivesAtMostOncePerRound) {
  std::vector<Transfer> transfers;
  for (int from = 0; from < 4; ++from) {
    for (int to = 0; to < 4; ++to) {
      for (int k = 0; k < 3; ++k) {
        Transfer t;
        t.from = from;
        t.to = to;
        transfers.push_back(t);
      }
    }
  }
  const std::vector<std::vector<int>> rounds = ScheduleRounds(transfers);
  size_t scheduled = 0;
  for (const auto& round : rounds) {
    std::set<int> senders, receivers;
    for (int i : round) {
      EXPECT_TRUE(senders.insert(transfers[i].from).second);
      EXPECT_TRUE(receivers.insert(transfers[i].to).second);
      EXPECT_NE(transfers[i].from, transfers[i].to);
    }
    scheduled += round.size();
  }
  EXPECT_EQ(scheduled, 4u * 3u * 3u);  // the 12 local ones are not in rounds
}

}  // namespace
}  // namespace cohort::checkpoint
