#include "coordinator/server_flags.h"

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

TimingFlags Defaults() {
  return TimingFlags{absl::Milliseconds(500), absl::Seconds(3),  absl::Seconds(10),
                     absl::Seconds(10),       absl::Minutes(10), absl::Seconds(30),
                     absl::Minutes(10),       absl::Minutes(2),   absl::Seconds(30)};
}

TEST(ServerFlagsTest, TheDefaultsPass) { EXPECT_TRUE(CheckTimingFlags(Defaults()).ok()); }

// Issue 21: each of these was accepted; 4294967396ms wrapped to 100 ms in
// the Welcome's uint32 milliseconds and workers flapped.
TEST(ServerFlagsTest, OutOfRangeDurationsNameTheirFlag) {
  struct Case {
    const char* flag;
    void (*set)(TimingFlags&);
  };
  const Case cases[] = {
      {"heartbeat_timeout", [](TimingFlags& f) { f.heartbeat_timeout = absl::Milliseconds(4294967396); }},
      {"heartbeat_timeout", [](TimingFlags& f) { f.heartbeat_timeout = absl::InfiniteDuration(); }},
      {"heartbeat_timeout", [](TimingFlags& f) { f.heartbeat_timeout = f.heartbeat_interval; }},
      {"heartbeat_interval", [](TimingFlags& f) { f.heartbeat_interval = absl::ZeroDuration(); }},
      {"readopt_grace", [](TimingFlags& f) { f.readopt_grace = absl::Seconds(-5); }},
      {"checkpoint_abandon_after", [](TimingFlags& f) { f.checkpoint_abandon_after = absl::ZeroDuration(); }},
      {"suspend_timeout", [](TimingFlags& f) { f.suspend_timeout = absl::ZeroDuration(); }},
      {"prepare_timeout", [](TimingFlags& f) { f.prepare_timeout = absl::InfiniteDuration(); }},
      {"hang_timeout_floor", [](TimingFlags& f) { f.hang_timeout_floor = absl::Seconds(-1); }},
      {"isolation_limit", [](TimingFlags& f) { f.isolation_limit = absl::Seconds(-1); }},
      {"partition_hold", [](TimingFlags& f) { f.partition_hold = absl::ZeroDuration(); }},
  };
  for (const Case& c : cases) {
    TimingFlags flags = Defaults();
    c.set(flags);
    const absl::Status status = CheckTimingFlags(flags);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("--", c.flag, "="))) << status;
  }
  TimingFlags off = Defaults();
  off.hang_timeout_floor = absl::ZeroDuration();  // documented: disables stall detection
  off.readopt_grace = absl::ZeroDuration();
  off.isolation_limit = absl::ZeroDuration();  // documented: never assume isolation
  EXPECT_TRUE(CheckTimingFlags(off).ok());
}

TEST(ServerFlagsTest, ListenAddressesNeedAPortFromZeroTo65535) {
  for (const char* good : {"127.0.0.1:7070", "0.0.0.0:0", "localhost:65535", "[::1]:7070",
                           "[::]:1", "coordinator-0.cluster_a.example:7070", "[fe80::1%2]:7070"}) {
    EXPECT_TRUE(CheckHostPort("listen", good).ok()) << good;
  }
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:", "127.0.0.1", ":7070", "::1:7070",
                          "127.0.0.1:+80", "127.0.0.1:7a", "127.0.0.1:000070070", "[]:1",
                          "a b:1", "host/x:1", "[::1%eth0 ]:1", "[zz]:1"}) {
    const absl::Status status = CheckHostPort("listen", bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("--listen")) << bad;
  }
  // A value that is not printable is not echoed.
  const absl::Status forged = CheckHostPort("listen", "host\nI forged line:1x");
  EXPECT_THAT(forged.message(), ::testing::Not(HasSubstr("forged")));
}

}  // namespace
}  // namespace cohort::coordinator
