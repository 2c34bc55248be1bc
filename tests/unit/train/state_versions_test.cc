// StateVersions: the previous step's state and the ZeRO-1 optimizer mirrors
// a rank keeps for peer recovery. Three data ranks run on threads over an
// in-memory communicator; moments and weights are synthetic values that
// encode (rank, step, index), so every view can be checked exactly.

#include "worker/train/state_versions.h"

#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/hub_communicator.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/gpt_model.h"
#include "worker/train/data_parallel.h"

namespace cohort::train {
namespace {

using ::cohort::testing::Hub;
using ::cohort::testing::HubCommunicator;

constexpr int kRanks = 3;
const model::GptConfig kTiny{
    .layers = 1, .heads = 2, .width = 16, .vocab_size = 32, .context_length = 8};

float Moment(int owner, int64_t step, size_t i, int which) {
  return static_cast<float>(owner * 1000000 + step * 1000 + static_cast<int64_t>(i % 997)) +
         (which == 0 ? 0.25f : 0.75f);
}
float Weight(int64_t step, size_t i) { return static_cast<float>(step) + 1e-3f * (i % 1000); }

// One data rank: its model, its own range's moments and its StateVersions.
struct Rank {
  Rank(compute::Backend* backend, int rank, bool keep_previous, const layout::CopyRing& ring)
      : rank(rank), ring(ring) {
    model = *model::GptModel::Create(kTiny, backend, {});
    range = layout::DataShardRange(model->num_params(), kRanks, rank);
    m.resize(range.end - range.begin);
    v.resize(range.end - range.begin);
    versions = std::make_unique<StateVersions>(
        model.get(), m.data(), v.data(), range.begin, range.end, kRanks, rank, /*zero1=*/true,
        StateVersionOptions{
            .keep_previous = keep_previous, .optimizer_replicas = 2, .copy_ring = ring});
  }
  // Writes step `step`'s synthetic state into the current buffers.
  void Fill(int64_t step) {
    for (size_t i = 0; i < model->num_params(); ++i) model->params()[i] = Weight(step, i);
    for (size_t i = 0; i < m.size(); ++i) {
      m[i] = Moment(rank, step, range.begin + i, 0);
      v[i] = Moment(rank, step, range.begin + i, 1);
    }
  }
  int rank;
  layout::CopyRing ring;
  std::unique_ptr<model::GptModel> model;
  layout::ShardRange range;
  std::vector<float> m, v;
  std::unique_ptr<StateVersions> versions;
};

// Expects `view` to be step `step`'s state of rank `r` (its mirror holds
// the moments of the rank before it on the copy ring).
void ExpectView(const StateVersions::View& view, const Rank& r, int64_t step) {
  ASSERT_EQ(view.step, step);
  for (size_t i = 0; i < r.model->num_params(); i += 37) {
    ASSERT_EQ(view.params[i], Weight(step, i)) << "rank " << r.rank << " param " << i;
  }
  for (size_t i = 0; i < r.m.size(); i += 11) {
    ASSERT_EQ(view.adam_m[i], Moment(r.rank, step, r.range.begin + i, 0));
    ASSERT_EQ(view.adam_v[i], Moment(r.rank, step, r.range.begin + i, 1));
  }
  ASSERT_EQ(view.mirrors.size(), 1u);
  const StateVersions::View::Mirror& mirror = view.mirrors[0];
  const int owner = r.ring.Owner(r.rank, 1);
  ASSERT_EQ(mirror.owner, owner);
  for (size_t i = 0; mirror.begin + i < mirror.end; i += 13) {
    ASSERT_EQ(mirror.adam_m[i], Moment(owner, step, mirror.begin + i, 0)) << "mirror " << i;
    ASSERT_EQ(mirror.adam_v[i], Moment(owner, step, mirror.begin + i, 1)) << "mirror " << i;
  }
}

class StateVersionsTest : public ::testing::Test {
 protected:
  void Make(bool keep_previous, const layout::CopyRing& ring = layout::CopyRing(kRanks)) {
    for (int r = 0; r < kRanks; ++r) {
      ranks_.push_back(std::make_unique<Rank>(&backend_, r, keep_previous, ring));
      groups_.push_back(std::make_unique<HubCommunicator>(&hub_, r, kRanks));
    }
  }
  // Runs `f(rank)` on one thread per rank.
  template <typename F>
  void OnEveryRank(F f) {
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) threads.emplace_back([&, r] { f(r); });
    for (std::thread& t : threads) t.join();
  }
  // A step from `step` to `step + 1` on every rank.
  void Step(int64_t step) {
    OnEveryRank([&](int r) {
      Rank& rank = *ranks_[r];
      rank.versions->BeforeUpdate(step);
      rank.Fill(step + 1);
      EXPECT_TRUE(rank.versions->ExchangeMirrors(groups_[r].get(), step + 1, absl::Seconds(10)).ok());
      rank.versions->AfterUpdate(step + 1);
    });
  }

  compute::CpuBackend backend_{compute::CpuBackendOptions{.num_threads = 1}};
  Hub hub_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::unique_ptr<HubCommunicator>> groups_;
};

TEST_F(StateVersionsTest, ARankHoldsItsNewestStepAndTheOneBeforeWithMirrors) {
  Make(/*keep_previous=*/true);
  OnEveryRank([&](int r) {
    Rank& rank = *ranks_[r];
    rank.Fill(5);
    rank.versions->SetCurrent(5);
    // Mirrors are not refreshed yet: step 5 is not complete.
    EXPECT_EQ(rank.versions->newest(), -1);
    ASSERT_TRUE(rank.versions->ExchangeMirrors(groups_[r].get(), 5, absl::Seconds(10)).ok());
    EXPECT_EQ(rank.versions->newest(), 5);
  });
  Step(5);
  Step(6);
  for (const auto& rank : ranks_) {
    EXPECT_EQ(rank->versions->newest(), 7);
    ExpectView(*rank->versions->Version(7), *rank, 7);
    ExpectView(*rank->versions->Version(6), *rank, 6);
    EXPECT_EQ(rank->versions->Version(5).status().code(), absl::StatusCode::kNotFound);
  }
}

// Ranks 0 and 1 on one host, rank 2 on another: the ring is 0, 2, 1, so
// rank 0's mirror is on rank 2 (and rank 2's on rank 1), not on rank 1.
TEST_F(StateVersionsTest, MirrorsFollowTheCopyRing) {
  const layout::CopyRing ring = layout::CopyRing::AcrossHosts({"a", "a", "b"});
  ASSERT_EQ(ring.Holder(0, 1), 2);
  Make(/*keep_previous=*/true, ring);
  OnEveryRank([&](int r) {
    ranks_[r]->Fill(1);
    ranks_[r]->versions->SetCurrent(1);
    ASSERT_TRUE(ranks_[r]->versions->ExchangeMirrors(groups_[r].get(), 1, absl::Seconds(10)).ok());
  });
  Step(1);
  EXPECT_EQ(ranks_[2]->versions->Version(2)->mirrors[0].owner, 0);
  EXPECT_EQ(ranks_[1]->versions->Version(2)->mirrors[0].owner, 2);
  for (const auto& rank : ranks_) {
    ExpectView(*rank->versions->Version(2), *rank, 2);
    ExpectView(*rank->versions->Version(1), *rank, 1);
  }
}

// A failure inside the end phase (the mirror refresh cut short after some
// bytes arrived) leaves the step before intact, mirrors included.
TEST_F(StateVersionsTest, ARefreshCutShortKeepsTheStepBefore) {
  Make(/*keep_previous=*/true);
  OnEveryRank([&](int r) {
    ranks_[r]->Fill(3);
    ranks_[r]->versions->SetCurrent(3);
    ASSERT_TRUE(ranks_[r]->versions->ExchangeMirrors(groups_[r].get(), 3, absl::Seconds(10)).ok());
  });
  Step(3);  // holds 4 and 3
  Rank& rank = *ranks_[1];
  rank.versions->BeforeUpdate(4);
  rank.Fill(5);
  // Only rank 0's moments arrive, and only the first message (m): then the
  // exchange fails (rank 1's v never comes).
  std::vector<float> partial_m(ranks_[0]->m.size(), -1.0f);
  hub_.Post(0, 1, 0x6d697272 + 2, partial_m.data(), partial_m.size() * sizeof(float));
  const absl::Status cut =
      rank.versions->ExchangeMirrors(groups_[1].get(), 5, absl::Milliseconds(50));
  EXPECT_FALSE(cut.ok());
  EXPECT_EQ(rank.versions->newest(), 4);
  ExpectView(*rank.versions->Version(4), rank, 4);
  EXPECT_EQ(rank.versions->Version(5).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rank.versions->Version(3).status().code(), absl::StatusCode::kNotFound);
}

// After a peer recovery in the same layout, survivors whose sessions were
// kept already hold their mirrors; only the replaced rank receives its own.
TEST_F(StateVersionsTest, AfterARestoreOnlyRanksMissingTheirMirrorsReceiveThem) {
  Make(/*keep_previous=*/true);
  OnEveryRank([&](int r) {
    ranks_[r]->Fill(3);
    ranks_[r]->versions->SetCurrent(3);
    ASSERT_TRUE(ranks_[r]->versions->ExchangeMirrors(groups_[r].get(), 3, absl::Seconds(10)).ok());
  });
  Step(3);  // every rank holds step 4 with its mirrors
  // Rank 2 is replaced: a new rank restored to step 4, without mirrors.
  ranks_[2] = std::make_unique<Rank>(&backend_, 2, /*keep_previous=*/true, ranks_[2]->ring);
  ranks_[2]->Fill(4);
  ranks_[2]->versions->SetCurrent(4);
  EXPECT_EQ(ranks_[2]->versions->newest(), -1);
  // Rank 1 holds rank 0's mirror (the tiny model's only non-empty shard):
  // had it received it again, it would hold these.
  ASSERT_FALSE(ranks_[0]->m.empty());
  std::vector<float> saved_m = ranks_[0]->m;
  std::fill(ranks_[0]->m.begin(), ranks_[0]->m.end(), -1.0f);
  OnEveryRank([&](int r) {
    ASSERT_TRUE(ranks_[r]
                    ->versions->ExchangeMirrors(groups_[r].get(), 4, absl::Seconds(10),
                                                /*only_missing=*/true)
                    .ok());
  });
  ranks_[0]->m = saved_m;
  for (const auto& rank : ranks_) {
    EXPECT_EQ(rank->versions->newest(), 4) << "rank " << rank->rank;
    ExpectView(*rank->versions->Version(4), *rank, 4);
  }
}

TEST_F(StateVersionsTest, WithoutKeepingThePreviousStepOnlyTheCurrentIsHeld) {
  Make(/*keep_previous=*/false);
  OnEveryRank([&](int r) {
    ranks_[r]->Fill(0);
    ranks_[r]->versions->SetCurrent(0);
    ASSERT_TRUE(ranks_[r]->versions->ExchangeMirrors(groups_[r].get(), 0, absl::Seconds(10)).ok());
  });
  Step(0);
  for (const auto& rank : ranks_) {
    EXPECT_EQ(rank->versions->newest(), 1);
    ExpectView(*rank->versions->Version(1), *rank, 1);
    EXPECT_EQ(rank->versions->Version(0).status().code(), absl::StatusCode::kNotFound);
    // Mirrors are double-buffered either way; no previous weights or
    // moments. Each buffer has room for any data rank's range (a session of
    // another rank may take it over), unless its owner's range is empty (the
    // tiny model's last ranks).
    const size_t n = rank->model->num_params();
    const layout::ShardRange owner =
        layout::DataShardRange(n, kRanks, (rank->rank + kRanks - 1) % kRanks);
    const size_t any_range = layout::PaddedShardedSize(n, kRanks) / kRanks;
    EXPECT_EQ(rank->versions->extra_bytes(),
              owner.end > owner.begin ? 4 * any_range * sizeof(float) : 0u);
  }
}

TEST_F(StateVersionsTest, TheFirstUpdateCallsItsCallbackOnceBeforeTheStateChanges) {
  Make(/*keep_previous=*/true);
  OnEveryRank([&](int r) {
    ranks_[r]->Fill(0);
    ranks_[r]->versions->SetCurrent(0);
    ASSERT_TRUE(ranks_[r]->versions->ExchangeMirrors(groups_[r].get(), 0, absl::Seconds(10)).ok());
  });
  // Rank 0's weights are another session's too (EngineTrainer: a session
  // built around a kept model shard): the callback sees them unchanged.
  int calls = 0;
  float seen = -1;
  ranks_[0]->versions->set_on_first_update([&] {
    ++calls;
    seen = ranks_[0]->model->params()[5];
  });
  Step(0);
  Step(1);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, Weight(0, 5));
}

}  // namespace
}  // namespace cohort::train
