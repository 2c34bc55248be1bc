#include "coordinator/service/stream_limiter.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(StreamLimiterTest, ClientIsThePeerAddressWithoutItsPort) {
  EXPECT_EQ(StreamLimiter::ClientOf("ipv4:10.0.0.7:51234"), "ipv4:10.0.0.7");
  EXPECT_EQ(StreamLimiter::ClientOf("ipv6:[::1]:9"), "ipv6:[::1]");
  EXPECT_EQ(StreamLimiter::ClientOf("ipv6:[fe80::1%eth0]:443"), "ipv6:[fe80::1%eth0]");
  EXPECT_EQ(StreamLimiter::ClientOf("unix:/run/cohort.sock"), "unix:/run/cohort.sock");
  EXPECT_EQ(StreamLimiter::ClientOf("ipv4:"), "ipv4:");
}

TEST(StreamLimiterTest, CountsPerClientAndFreesOnRelease) {
  StreamLimiter limiter(2);
  std::vector<StreamLimiter::Lease> held;
  for (const char* peer : {"ipv4:10.0.0.7:1", "ipv4:10.0.0.7:2"}) {
    absl::StatusOr<StreamLimiter::Lease> lease = limiter.Acquire(peer, "Jobs.Watch");
    ASSERT_TRUE(lease.ok()) << lease.status();
    held.push_back(*std::move(lease));
  }
  absl::StatusOr<StreamLimiter::Lease> third = limiter.Acquire("ipv4:10.0.0.7:3", "Jobs.Watch");
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("Jobs.Watch: client ipv4:10.0.0.7"));
  EXPECT_THAT(third.status().message(), HasSubstr("--max_streams_per_client"));
  // Another host is not affected.
  EXPECT_TRUE(limiter.Acquire("ipv4:10.0.0.8:1", "Jobs.Watch").ok());
  EXPECT_EQ(limiter.open("ipv4:10.0.0.8"), 0);  // that lease was a temporary

  held.pop_back();
  EXPECT_EQ(limiter.open("ipv4:10.0.0.7"), 1);
  absl::StatusOr<StreamLimiter::Lease> again = limiter.Acquire("ipv4:10.0.0.7:4", "Jobs.Watch");
  ASSERT_TRUE(again.ok());
  // Moving a lease keeps one slot; an explicit Release frees it once.
  StreamLimiter::Lease moved = *std::move(again);
  EXPECT_EQ(limiter.open("ipv4:10.0.0.7"), 2);
  moved.Release();
  moved.Release();
  EXPECT_EQ(limiter.open("ipv4:10.0.0.7"), 1);
}

TEST(StreamLimiterTest, ZeroMeansNoLimit) {
  StreamLimiter limiter(0);
  std::vector<StreamLimiter::Lease> held;
  for (int i = 0; i < 5000; ++i) {
    absl::StatusOr<StreamLimiter::Lease> lease = limiter.Acquire("ipv4:127.0.0.1:1", "Attach");
    ASSERT_TRUE(lease.ok());
    held.push_back(*std::move(lease));
  }
  EXPECT_EQ(limiter.open("ipv4:127.0.0.1"), 5000);
  held.clear();
  EXPECT_EQ(limiter.open("ipv4:127.0.0.1"), 0);
}

}  // namespace
}  // namespace cohort::coordinator
