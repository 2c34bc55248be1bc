// Reachability: which candidates a plan keeps when workers reported that
// they cannot reach each other, and how long a cut holds.

#include "coordinator/membership/reachability.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::ElementsAre;

const absl::Time kStart = absl::FromUnixSeconds(1000);

// Workers "<host>w<i>" on each host, `count` per host.
std::vector<PlannerWorker> Workers(const std::vector<std::pair<std::string, int>>& hosts) {
  std::vector<PlannerWorker> out;
  for (const auto& [host, count] : hosts) {
    for (int i = 0; i < count; ++i) {
      out.push_back({WorkerId(host + "w" + std::to_string(i)), Incarnation(1), host, i});
    }
  }
  return out;
}

std::vector<std::string> Ids(const std::vector<PlannerWorker>& workers) {
  std::vector<std::string> ids;
  for (const PlannerWorker& w : workers) ids.push_back(w.id.value());
  return ids;
}

TEST(ReachabilityTest, AHostCutKeepsTheLargerSideOrTheHoldersOrTheFirstHost) {
  Reachability r({.hold = absl::Seconds(30)});
  r.Report({"aw0", "a"}, {"bw1", "b"}, kStart);
  // Equal sides, no holders: the first host by name.
  std::vector<PlannerWorker> c = Workers({{"a", 2}, {"b", 2}});
  EXPECT_THAT(r.Filter(&c, {}, kStart), ElementsAre("bw0", "bw1"));
  EXPECT_THAT(Ids(c), ElementsAre("aw0", "aw1"));
  // The side holding the state.
  c = Workers({{"a", 2}, {"b", 2}});
  EXPECT_THAT(r.Filter(&c, {"bw0"}, kStart), ElementsAre("aw0", "aw1"));
  // The side with more workers, whatever it holds.
  c = Workers({{"a", 2}, {"b", 3}});
  EXPECT_THAT(r.Filter(&c, {"aw0", "aw1"}, kStart), ElementsAre("aw0", "aw1"));
  // A host in no cut is always kept.
  c = Workers({{"a", 2}, {"b", 2}, {"c", 1}});
  EXPECT_THAT(r.Filter(&c, {}, kStart), ElementsAre("bw0", "bw1"));
  EXPECT_THAT(Ids(c), ElementsAre("aw0", "aw1", "cw0"));
}

TEST(ReachabilityTest, CutsAmongThreeHostsKeepTheLargestSetWithoutACut) {
  Reachability r({.hold = absl::Seconds(30)});
  r.Report({"aw0", "a"}, {"bw0", "b"}, kStart);
  r.Report({"cw0", "c"}, {"bw0", "b"}, kStart);
  // a and c still reach each other: both kept (3 workers) over b (2).
  std::vector<PlannerWorker> c = Workers({{"a", 1}, {"b", 2}, {"c", 2}});
  EXPECT_THAT(r.Filter(&c, {}, kStart), ElementsAre("bw0", "bw1"));
  // With a <-> c cut too, one host is left: the largest.
  r.Report({"aw0", "a"}, {"cw1", "c"}, kStart);
  c = Workers({{"a", 1}, {"b", 2}, {"c", 3}});
  EXPECT_THAT(r.Filter(&c, {}, kStart), ElementsAre("aw0", "bw0", "bw1"));
}

TEST(ReachabilityTest, APairOnOneHostDropsOneWorkerNotTheHolder) {
  Reachability r({.hold = absl::Seconds(30)});
  r.Report({"aw0", "a"}, {"aw1", "a"}, kStart);
  std::vector<PlannerWorker> c = Workers({{"a", 3}});
  EXPECT_THAT(r.Filter(&c, {"aw1"}, kStart), ElementsAre("aw0"));
  EXPECT_THAT(Ids(c), ElementsAre("aw1", "aw2"));
}

TEST(ReachabilityTest, ACutHoldsForItsTimeAndLongerWhenItComesBack) {
  Reachability r({.hold = absl::Seconds(10)});
  r.Report({"aw0", "a"}, {"bw0", "b"}, kStart);
  EXPECT_TRUE(r.Holding(kStart + absl::Seconds(9)));
  EXPECT_THAT(r.Describe(kStart), ::testing::HasSubstr("host a <-> b"));
  EXPECT_FALSE(r.TakeEnded(kStart + absl::Seconds(9)));
  std::vector<PlannerWorker> c = Workers({{"a", 1}, {"b", 1}});
  EXPECT_TRUE(r.Filter(&c, {}, kStart + absl::Seconds(11)).empty()) << "the hold ended";
  EXPECT_TRUE(r.TakeEnded(kStart + absl::Seconds(11)));
  EXPECT_FALSE(r.TakeEnded(kStart + absl::Seconds(12))) << "reported once";
  // Seen again soon after: held twice as long.
  r.Report({"bw0", "b"}, {"aw0", "a"}, kStart + absl::Seconds(12));
  EXPECT_TRUE(r.Holding(kStart + absl::Seconds(31)));
  EXPECT_FALSE(r.Holding(kStart + absl::Seconds(33)));
  // Reported again while held: the same failure, no longer.
  Reachability once({.hold = absl::Seconds(10)});
  once.Report({"aw0", "a"}, {"bw0", "b"}, kStart);
  once.Report({"bw0", "b"}, {"aw0", "a"}, kStart + absl::Seconds(5));
  EXPECT_FALSE(once.Holding(kStart + absl::Seconds(11)));
  // Forgotten after three holds: a fresh one.
  once.TakeEnded(kStart + absl::Seconds(41));
  once.Report({"aw0", "a"}, {"bw0", "b"}, kStart + absl::Seconds(41));
  EXPECT_FALSE(once.Holding(kStart + absl::Seconds(52)));
}

}  // namespace
}  // namespace cohort::coordinator
