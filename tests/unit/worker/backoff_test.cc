#include "worker/agent/backoff.h"

#include "gtest/gtest.h"

namespace cohort::worker {
namespace {

void ExpectWithin(absl::Duration actual, absl::Duration nominal, double jitter) {
  EXPECT_GE(actual, nominal * (1 - jitter)) << "nominal " << nominal;
  EXPECT_LE(actual, nominal * (1 + jitter)) << "nominal " << nominal;
}

TEST(BackoffTest, DoublesFromInitialUpToTheCapWithinJitter) {
  Backoff backoff(BackoffOptions{.seed = 7});
  const absl::Duration expected[] = {
      absl::Milliseconds(100), absl::Milliseconds(200),  absl::Milliseconds(400),
      absl::Milliseconds(800), absl::Milliseconds(1600), absl::Milliseconds(3200),
      absl::Seconds(5),        absl::Seconds(5),         absl::Seconds(5)};
  for (absl::Duration nominal : expected) ExpectWithin(backoff.Next(), nominal, 0.2);
}

TEST(BackoffTest, HoldingAnAssignmentCapsAtMaxWhileHolding) {
  // A holder must be back within a restarted coordinator's grace; a worker
  // with nothing to keep may back off further.
  Backoff backoff(BackoffOptions{.seed = 7});
  for (int i = 0; i < 5; ++i) backoff.Next();  // base now 3.2 s
  ExpectWithin(backoff.Next(/*holding=*/true), absl::Seconds(1), 0.2);
  ExpectWithin(backoff.Next(/*holding=*/false), absl::Seconds(5), 0.2);
  ExpectWithin(backoff.Next(/*holding=*/true), absl::Seconds(1), 0.2);
  Backoff early(BackoffOptions{.seed = 7});
  ExpectWithin(early.Next(/*holding=*/true), absl::Milliseconds(100), 0.2);
}

TEST(BackoffTest, ResetStartsOver) {
  Backoff backoff(BackoffOptions{.seed = 7});
  for (int i = 0; i < 10; ++i) backoff.Next();
  backoff.Reset();
  ExpectWithin(backoff.Next(), absl::Milliseconds(100), 0.2);
}

TEST(BackoffTest, JitterSpreadsDelays) {
  // Two workers that lost the coordinator together should not retry in step.
  Backoff a(BackoffOptions{.seed = 1});
  Backoff b(BackoffOptions{.seed = 2});
  int equal = 0;
  for (int i = 0; i < 8; ++i) equal += a.Next() == b.Next();
  EXPECT_LT(equal, 8);
}

TEST(BackoffTest, ZeroJitterIsExact) {
  Backoff backoff(BackoffOptions{.initial = absl::Milliseconds(10),
                                 .multiplier = 3,
                                 .max = absl::Milliseconds(50),
                                 .jitter = 0,
                                 .seed = 3});
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(10));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(30));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(50));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(50));
}

}  // namespace
}  // namespace cohort::worker
