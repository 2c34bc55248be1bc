// WarmSpare (worker/engine/warm_spare.h): what it reports while it builds,
// when it keeps, rebuilds or releases what it prepared, and what a Prepare
// takes from it. Most builds are fakes the test releases when it chooses
// (a run without a session, whose release its communicators report); the
// hand-over builds the small job's real warm session.

#include "worker/engine/warm_spare.h"

#include <atomic>
#include <memory>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/engine_runs.h"
#include "tests/testing/wait.h"
#include "worker/engine/session_builder.h"

namespace cohort::worker {
namespace {

using ::testing::HasSubstr;
using testing::WaitUntil;

constexpr absl::Duration kWait = absl::Seconds(60);
constexpr absl::Duration kPoll = absl::Milliseconds(1);

class WarmSpareTest : public ::testing::Test {
 protected:
  // A build that waits for `release_` (when `gated`) and then returns a run
  // of `bytes` without a session, or fails with `failure` when set.
  WarmSpare::BuildFn FakeBuild(bool gated, absl::Status failure = absl::OkStatus()) {
    return [this, gated,
            failure](const Assignment&) -> absl::StatusOr<std::unique_ptr<GenerationRun>> {
      builds_.fetch_add(1);
      if (gated) release_.WaitForNotification();
      if (!failure.ok()) return failure;
      auto run = std::make_unique<GenerationRun>();
      run->warm_bytes = 1234;
      run->comms = std::make_unique<testing::AbortRecordingComms>(
          [this](const absl::Status&) { released_.fetch_add(1); });
      return run;
    };
  }

  static v1::WarmSpare WaitState(const WarmSpare& spare, v1::WarmSpareState state) {
    WaitUntil([&] { return spare.status().state() == state; }, kWait, kPoll);
    EXPECT_EQ(spare.status().state(), state) << spare.status().message();
    return spare.status();
  }

  const v1::JobSpec spec_ = testing::EngineJobSpec(8, /*replicas=*/2);
  const Assignment slot_ = testing::EngineMember(spec_, 1, testing::EngineMesh(2), 1);
  std::atomic<int> builds_{0};
  std::atomic<int> released_{0};
  absl::Notification release_;
};

TEST_F(WarmSpareTest, WithoutAMemoryBoundItSaysPreparingAheadIsOffAndBuildsNothing) {
  WarmSpare spare(0, FakeBuild(false));
  spare.Warm(slot_);
  const v1::WarmSpare status = spare.status();
  EXPECT_EQ(status.state(), v1::WARM_SPARE_STATE_COLD);
  EXPECT_EQ(status.job_id(), "engine-1");
  EXPECT_EQ(status.rank(), 1);
  EXPECT_THAT(status.message(), HasSubstr("--warm_spare_memory 0"));
  EXPECT_EQ(builds_.load(), 0);
}

TEST_F(WarmSpareTest, ItIsWarmingWhileItBuildsThenWarmWithTheSessionsBytes) {
  WarmSpare spare(1 << 30, FakeBuild(/*gated=*/true));
  spare.Warm(slot_);
  const v1::WarmSpare warming = WaitState(spare, v1::WARM_SPARE_STATE_WARMING);
  EXPECT_EQ(warming.generation(), 1u);
  EXPECT_EQ(warming.rank(), 1);
  release_.Notify();
  const v1::WarmSpare warm = WaitState(spare, v1::WARM_SPARE_STATE_WARM);
  EXPECT_EQ(warm.bytes(), 1234u);

  // The same place of a newer generation: what was built still fits, at once.
  spare.Warm(testing::EngineMember(spec_, 2, testing::EngineMesh(2), 1));
  EXPECT_EQ(spare.status().state(), v1::WARM_SPARE_STATE_WARM);
  EXPECT_EQ(spare.status().generation(), 2u);

  // Nothing wanted any more: released, and nothing reported.
  spare.Warm(Assignment{});
  WaitState(spare, v1::WARM_SPARE_STATE_UNSPECIFIED);
  WaitUntil([&] { return released_.load() == 1; }, kWait, kPoll);
  EXPECT_EQ(released_.load(), 1);
  EXPECT_EQ(builds_.load(), 1);
}

TEST_F(WarmSpareTest, AFailedBuildIsColdWithItsReason) {
  WarmSpare spare(1 << 30, FakeBuild(false, absl::ResourceExhaustedError("too big for the bound")));
  spare.Warm(slot_);
  const v1::WarmSpare cold = WaitState(spare, v1::WARM_SPARE_STATE_COLD);
  EXPECT_EQ(cold.message(), "too big for the bound");
}

TEST_F(WarmSpareTest, TakeWaitsForTheBuildInFlightAndReleasesWhatDoesNotFit) {
  WarmSpare spare(1 << 30, FakeBuild(/*gated=*/true));
  spare.Warm(slot_);
  WaitState(spare, v1::WARM_SPARE_STATE_WARMING);
  std::unique_ptr<GenerationRun> taken;
  std::thread prepare([&] { taken = spare.Take(slot_); });
  release_.Notify();
  prepare.join();
  // The fake's run has no session, so fits nothing: Take waited for it to
  // be built and released it before returning.
  EXPECT_EQ(taken, nullptr);
  EXPECT_EQ(released_.load(), 1);
  EXPECT_EQ(spare.status().state(), v1::WARM_SPARE_STATE_UNSPECIFIED);
}

TEST_F(WarmSpareTest, TakeHandsOverTheSessionOfItsPlaceOnce) {
  FakeClock clock;
  EngineTrainerOptions options = testing::OfflineEngineOptions(&clock);
  options.warm_memory_bytes = uint64_t{1} << 30;
  SessionBuilder builder(options, nullptr, nullptr);
  WarmSpare spare(options.warm_memory_bytes,
                  [&builder](const Assignment& slot) { return builder.BuildWarm(slot); });
  spare.Warm(slot_);
  WaitState(spare, v1::WARM_SPARE_STATE_WARM);
  // Another job's Prepare releases it.
  Assignment other = slot_;
  other.job_id = JobId("other-1");
  EXPECT_EQ(spare.Take(other), nullptr);
  EXPECT_EQ(spare.status().state(), v1::WARM_SPARE_STATE_UNSPECIFIED);

  spare.Warm(slot_);
  WaitState(spare, v1::WARM_SPARE_STATE_WARM);
  const Assignment place = testing::EngineMember(spec_, 2, testing::EngineMesh(2), 1);
  std::unique_ptr<GenerationRun> taken = spare.Take(place);
  ASSERT_NE(taken, nullptr);
  EXPECT_NE(taken->session, nullptr);
  EXPECT_TRUE(SessionBuilder::CanKeepSession(*taken, place));
  EXPECT_EQ(spare.status().state(), v1::WARM_SPARE_STATE_UNSPECIFIED);
  EXPECT_EQ(spare.Take(place), nullptr);  // the worker never holds two sessions
}

}  // namespace
}  // namespace cohort::worker
