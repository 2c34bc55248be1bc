// StallDetector (coordinator/membership/stall_detector.h): when a running generation
// counts as stalled and whom it blames, on explicit times.

#include "coordinator/membership/stall_detector.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::ElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);
const StallDetector::Options kOptions{absl::Seconds(30), 20.0};

std::vector<WorkerId> Members(std::initializer_list<const char*> ids) {
  std::vector<WorkerId> out;
  for (const char* id : ids) out.emplace_back(id);
  return out;
}

TEST(StallDetectorTest, NobodyAdvancingForTheFloorIsAStallOfThoseNotWaiting) {
  StallDetector d;
  d.Start(Members({"w0", "w1", "w2"}), 10, kT0);
  EXPECT_FALSE(d.Check(kT0 + absl::Seconds(29), kOptions).has_value());
  d.Observe(WorkerId("w1"), 10, /*waiting_for_peers=*/true, kT0 + absl::Seconds(5));
  const std::optional<StallDetector::Stall> stall = d.Check(kT0 + absl::Seconds(30), kOptions);
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->idle, absl::Seconds(30));
  EXPECT_THAT(stall->stuck, ElementsAre("w0", "w2"));
}

TEST(StallDetectorTest, AnyMemberAdvancingRestartsTheClock) {
  StallDetector d;
  d.Start(Members({"w0", "w1"}), 0, kT0);
  d.Observe(WorkerId("w0"), 1, false, kT0 + absl::Seconds(20));
  // The same step again is no advance.
  d.Observe(WorkerId("w0"), 1, false, kT0 + absl::Seconds(40));
  EXPECT_FALSE(d.Check(kT0 + absl::Seconds(49), kOptions).has_value());
  EXPECT_TRUE(d.Check(kT0 + absl::Seconds(50), kOptions).has_value());
}

TEST(StallDetectorTest, TheTimeoutGrowsWithTheMedianStepTime) {
  StallDetector d;
  d.Start(Members({"w0"}), 0, kT0);
  // Median 3 s (one outlier of 100 s): 20 x 3 = 60 s, above the 30 s floor.
  for (double s : {3.0, 2.0, 100.0, 3.0, 4.0}) d.ObserveStepTime(s);
  d.ObserveStepTime(0);    // ignored
  d.ObserveStepTime(-1);   // ignored
  EXPECT_FALSE(d.Check(kT0 + absl::Seconds(59), kOptions).has_value());
  EXPECT_TRUE(d.Check(kT0 + absl::Seconds(60), kOptions).has_value());
  // Only the newest kStepTimes count: fast steps push the slow ones out.
  for (size_t i = 0; i < StallDetector::kStepTimes; ++i) d.ObserveStepTime(0.1);
  EXPECT_TRUE(d.Check(kT0 + absl::Seconds(30), kOptions).has_value());
}

TEST(StallDetectorTest, EveryoneWaitingBlamesNobody) {
  StallDetector d;
  d.Start(Members({"w0", "w1"}), 0, kT0);
  d.Observe(WorkerId("w0"), 0, true, kT0);
  d.Observe(WorkerId("w1"), 0, true, kT0);
  EXPECT_FALSE(d.Check(kT0 + absl::Hours(1), kOptions).has_value());
}

TEST(StallDetectorTest, OffWithoutAFloorAndForOthersAndRemovedMembers) {
  StallDetector d;
  EXPECT_FALSE(d.Check(kT0 + absl::Hours(1), kOptions).has_value());  // no generation
  d.Start(Members({"w0", "w1"}), 0, kT0);
  EXPECT_FALSE(d.Check(kT0 + absl::Hours(1), {absl::ZeroDuration(), 20.0}).has_value());
  // A stranger's heartbeat counts for nothing.
  d.Observe(WorkerId("w9"), 5, false, kT0 + absl::Seconds(29));
  d.Remove(WorkerId("w1"));
  const std::optional<StallDetector::Stall> stall = d.Check(kT0 + absl::Seconds(30), kOptions);
  ASSERT_TRUE(stall.has_value());
  EXPECT_THAT(stall->stuck, ElementsAre("w0"));
  // A new generation starts everyone afresh.
  d.Start(Members({"w2"}), 7, kT0 + absl::Seconds(30));
  EXPECT_FALSE(d.Check(kT0 + absl::Seconds(59), kOptions).has_value());
}

TEST(StallDetectorTest, TheCoordinatorsOwnPauseIsDiscounted) {
  StallDetector d;
  d.Start(Members({"w0"}), 0, kT0);
  // The coordinator was stopped for 25 s of the 40 s that passed.
  d.Discount(absl::Seconds(25), kT0 + absl::Seconds(40));
  EXPECT_FALSE(d.Check(kT0 + absl::Seconds(54), kOptions).has_value());
  EXPECT_TRUE(d.Check(kT0 + absl::Seconds(55), kOptions).has_value());
  // Never later than now.
  d.Discount(absl::Hours(1), kT0 + absl::Seconds(60));
  EXPECT_FALSE(d.Check(kT0 + absl::Seconds(89), kOptions).has_value());
}

}  // namespace
}  // namespace cohort::coordinator
