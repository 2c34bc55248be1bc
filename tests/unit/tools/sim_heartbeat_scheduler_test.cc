#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/wait.h"
#include "tools/sim/heartbeat_scheduler.h"

namespace cohort::sim {
namespace {

TEST(PhaseOffsetTest, SpreadsUniformly) {
  const absl::Duration interval = absl::Seconds(1);
  EXPECT_EQ(PhaseOffset(0, 4, interval), absl::ZeroDuration());
  EXPECT_EQ(PhaseOffset(1, 4, interval), absl::Milliseconds(250));
  EXPECT_EQ(PhaseOffset(3, 4, interval), absl::Milliseconds(750));
  EXPECT_EQ(PhaseOffset(9999, 10000, interval), absl::Microseconds(999900));
  EXPECT_EQ(PhaseOffset(0, 0, interval), absl::ZeroDuration());
}

TEST(HeartbeatSchedulerTest, CallsEveryWorkerRepeatedlyInPhaseOrder) {
  constexpr int kWorkers = 12;
  absl::Mutex mu;
  std::vector<int> calls(kWorkers, 0);
  std::vector<int> order;  // first round only
  HeartbeatScheduler scheduler(
      {.count = kWorkers, .interval = absl::Milliseconds(30), .threads = 1}, [&](int i) {
        absl::MutexLock lock(&mu);
        if (calls[i]++ == 0) order.push_back(i);
      });
  scheduler.Start();
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        for (int c : calls) {
          if (c < 3) return false;
        }
        return true;
      },
      absl::Seconds(20)));
  scheduler.Stop();
  absl::MutexLock lock(&mu);
  std::vector<int> expected;
  for (int i = 0; i < kWorkers; ++i) expected.push_back(i);
  EXPECT_EQ(order, expected);
}

TEST(HeartbeatSchedulerTest, SeveralThreadsCoverAllWorkers) {
  constexpr int kWorkers = 50;
  std::vector<std::atomic<int>> calls(kWorkers);
  HeartbeatScheduler scheduler(
      {.count = kWorkers, .interval = absl::Milliseconds(20), .threads = 3},
      [&](int i) { calls[i].fetch_add(1); });
  scheduler.Start();
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        for (const auto& c : calls) {
          if (c.load() < 2) return false;
        }
        return true;
      },
      absl::Seconds(20)));
  scheduler.Stop();
  scheduler.Stop();  // idempotent
}

TEST(HeartbeatSchedulerTest, StopsPromptlyWithLongInterval) {
  std::atomic<int> calls{0};
  HeartbeatScheduler scheduler({.count = 2, .interval = absl::Hours(1), .threads = 2},
                               [&](int) { calls.fetch_add(1); });
  scheduler.Start();
  // Worker 0 is due at once; worker 1 half an hour later.
  EXPECT_TRUE(testing::WaitUntil([&] { return calls.load() == 1; }, absl::Seconds(10)));
  const absl::Time start = absl::Now();
  scheduler.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace cohort::sim
