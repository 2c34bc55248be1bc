// SessionCache (worker/engine/session_cache.h): which generations a worker
// holds state of, and for how long, as runs of the small job are installed,
// kept, trained and suspended.

#include "worker/engine/session_cache.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/engine_runs.h"
#include "worker/engine/session_builder.h"

namespace cohort::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

std::vector<std::pair<uint64_t, int64_t>> Pairs(const std::vector<v1::HeldState>& held) {
  std::vector<std::pair<uint64_t, int64_t>> out;
  for (const v1::HeldState& h : held) out.push_back({h.generation(), h.step()});
  return out;
}

class SessionCacheTest : public ::testing::Test {
 protected:
  SessionCacheTest() : options_(testing::OfflineEngineOptions(&clock_)) {}

  // A solo run of generation `generation` (its session kept from `keep`
  // when set) whose state is of `step` steps (-1: none consistent).
  std::unique_ptr<GenerationRun> Run(uint64_t generation, int64_t step,
                                     GenerationRun* keep = nullptr) {
    absl::StatusOr<std::unique_ptr<GenerationRun>> run =
        builder_.Build(testing::EngineMember(spec_, generation, testing::EngineMesh(1), 0), keep,
                       nullptr, nullptr);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return nullptr;
    if (step >= 0) (*run)->session->runner().versions().SetCurrent(step);
    return *std::move(run);
  }

  FakeClock clock_;
  EngineTrainerOptions options_;
  SessionBuilder builder_{options_, nullptr, nullptr};
  const v1::JobSpec spec_ = testing::EngineJobSpec(8);
  SessionCache cache_;
};

TEST_F(SessionCacheTest, TheSourceGenerationStaysUntilTheNewOneHasTrained) {
  GenerationRun* first = cache_.Install(Run(1, 3), nullptr, false, nullptr);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(cache_.current(), first);
  EXPECT_THAT(Pairs(cache_.HeldStates()), ElementsAre(Pair(1u, 3)));

  GenerationRun* second = cache_.Install(Run(2, 3), first, false, nullptr);
  EXPECT_EQ(cache_.current(), second);
  EXPECT_EQ(cache_.Find(1), first);
  EXPECT_EQ(cache_.Find(2), second);
  EXPECT_EQ(cache_.Find(3), nullptr);
  // Until it trains, the run reports the source's state with its own.
  EXPECT_THAT(Pairs(second->kept), ElementsAre(Pair(1u, 3)));
  EXPECT_THAT(Pairs(cache_.HeldStates()), ElementsAre(Pair(2u, 3), Pair(1u, 3)));

  // Suspended before it trained: both stay.
  cache_.Suspend(absl::AbortedError("suspended"));
  EXPECT_EQ(cache_.Find(1), first);
  second->trained = true;
  cache_.Suspend(absl::AbortedError("suspended"));
  EXPECT_EQ(cache_.Find(1), nullptr);
  EXPECT_EQ(cache_.Find(2), second);
  EXPECT_THAT(Pairs(cache_.HeldStates()), ElementsAre(Pair(2u, 3)));
}

TEST_F(SessionCacheTest, AKeptSessionHoldsTheOlderGenerationsUntilItTrains) {
  std::unique_ptr<GenerationRun> first = Run(1, 5);
  GenerationRun* source = cache_.Install(std::move(first), nullptr, false, nullptr);
  std::unique_ptr<GenerationRun> second = Run(2, 5, source);
  ASSERT_NE(second, nullptr);
  GenerationRun* kept = cache_.Install(std::move(second), source, true, nullptr);
  // The source run (now without a session) is gone; the kept one answers
  // for both generations.
  EXPECT_EQ(cache_.Find(1), kept);
  EXPECT_EQ(cache_.Find(2), kept);
  EXPECT_THAT(Pairs(kept->kept), ElementsAre(Pair(1u, 5)));
  EXPECT_THAT(Pairs(cache_.HeldStates()), ElementsAre(Pair(2u, 5), Pair(1u, 5)));
  kept->trained = true;
  EXPECT_EQ(cache_.Find(1), nullptr);
  EXPECT_THAT(Pairs(cache_.HeldStates()), ElementsAre(Pair(2u, 5)));
}

TEST_F(SessionCacheTest, ARunNotRestoredFromTheHeldOnesReleasesThem) {
  GenerationRun* first = cache_.Install(Run(1, 2), nullptr, false, nullptr);
  GenerationRun* second = cache_.Install(Run(2, 2), first, false, nullptr);
  ASSERT_EQ(cache_.Find(1), first);
  // Generation 3 starts from a checkpoint: nothing held is its source.
  GenerationRun* third = cache_.Install(Run(3, 0), nullptr, false, nullptr);
  EXPECT_EQ(cache_.Find(1), nullptr);
  EXPECT_EQ(cache_.Find(2), nullptr);
  EXPECT_EQ(cache_.Find(3), third);
  EXPECT_THAT(third->kept, IsEmpty());
  (void)second;
  cache_.Clear(absl::AbortedError("stopped"));
  EXPECT_EQ(cache_.current(), nullptr);
  EXPECT_THAT(cache_.HeldStates(), IsEmpty());
}

TEST_F(SessionCacheTest, ARunWithoutAConsistentStateReportsNothing) {
  cache_.Install(Run(1, -1), nullptr, false, nullptr);
  EXPECT_THAT(cache_.HeldStates(), IsEmpty());
  EXPECT_NE(cache_.Find(1), nullptr);  // its buffers may still serve a later plan
}

}  // namespace
}  // namespace cohort::worker
