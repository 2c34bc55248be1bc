// NetnsHosts, the multi-host test network: namespaces reach each other over
// their own addresses, a cut path fails (at once for the cut side, as
// silence for the other), a rate limit holds, a downed link is silent, and
// nothing is left behind. Skips where namespaces cannot be made (not root).

#include "tests/testing/netns_hosts.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace cohort::testing {
namespace {

constexpr int kPort = 5555;

// Accepts connections on (address, port) and answers each with the number
// of bytes it received before the client's half-close.
constexpr char kServer[] = R"(
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print('listening', flush=True)
while True:
    c, _ = s.accept()
    n = 0
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        n += len(d)
    c.sendall(str(n).encode())
    c.close()
)";

// Sends argv[3] bytes to (argv[1], argv[2]) within argv[4] seconds; prints
// "<bytes echoed> <seconds>", or exits 3 saying why it could not.
constexpr char kClient[] = R"(
import socket, sys, time
try:
    start = time.monotonic()
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
    c.sendall(b'x' * int(sys.argv[3]))
    c.shutdown(socket.SHUT_WR)
    n = c.recv(64).decode()
    print(n, time.monotonic() - start)
except Exception as e:
    print('failed:', repr(e))
    sys.exit(3)
)";

class NetnsHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<NetnsHosts>> hosts = NetnsHosts::Create(3);
    if (absl::IsUnavailable(hosts.status())) GTEST_SKIP() << hosts.status().message();
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    hosts_ = *std::move(hosts);
    // A server on host 1 and one on host 0.
    for (int host : {0, 1}) {
      auto [binary, args] = hosts_->Command(
          host, "python3", {"-c", kServer, hosts_->address(host), absl::StrCat(kPort)});
      absl::StatusOr<std::unique_ptr<Subprocess>> server =
          Subprocess::Start({.binary = binary, .args = args});
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
      absl::StatusOr<std::string> ready =
          WaitForLogLine(*servers_.back(), "listening", absl::Seconds(30));
      ASSERT_TRUE(ready.ok()) << ready.status();
    }
  }

  // Host `from` (-1: the test's own namespace, through the bridge) sends
  // `bytes` to host `to`'s server: the bytes echoed and the seconds it took,
  // or the client's failure.
  absl::StatusOr<std::pair<int64_t, double>> Send(int from, int to, int64_t bytes,
                                                  double timeout_s = 10) {
    const std::vector<std::string> client = {"-c", kClient, hosts_->address(to),
                                             absl::StrCat(kPort), absl::StrCat(bytes),
                                             absl::StrCat(timeout_s)};
    auto [binary, args] = from < 0 ? std::pair{std::string("python3"), client}
                                   : hosts_->Command(from, "python3", client);
    absl::StatusOr<CommandResult> result = RunCommand(binary, args, absl::Seconds(60));
    if (!result.ok()) return result.status();
    if (result->exit_code != 0) return absl::UnavailableError(result->output);
    std::vector<std::string> fields =
        absl::StrSplit(absl::StripAsciiWhitespace(result->output), ' ');
    std::pair<int64_t, double> out;
    if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &out.first) ||
        !absl::SimpleAtod(fields[1], &out.second)) {
      return absl::InternalError(absl::StrCat("client printed: ", result->output));
    }
    return out;
  }

  std::unique_ptr<NetnsHosts> hosts_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
};

TEST_F(NetnsHostsTest, HostsReachEachOtherOverTheirOwnAddresses) {
  for (auto [from, to] : {std::pair{0, 1}, std::pair{1, 0}, std::pair{2, 1}, std::pair{-1, 0}}) {
    absl::StatusOr<std::pair<int64_t, double>> sent = Send(from, to, 1 << 20);
    ASSERT_TRUE(sent.ok()) << from << " -> " << to << ": " << sent.status();
    EXPECT_EQ(sent->first, 1 << 20) << from << " -> " << to;
  }
  // Loopback is each host's own: host 0's server is not on host 2's.
  auto [binary, args] = hosts_->Command(
      2, "python3", {"-c", kClient, "127.0.0.1", absl::StrCat(kPort), "10", "2"});
  absl::StatusOr<CommandResult> local = RunCommand(binary, args, absl::Seconds(30));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->exit_code, 3) << local->output;
}

TEST_F(NetnsHostsTest, ACutFailsTheCutSideAtOnceAndIsSilenceForTheOther) {
  ASSERT_TRUE(hosts_->Cut(0, 1).ok());
  // Host 0's sends to host 1 fail at once.
  absl::StatusOr<std::pair<int64_t, double>> cut = Send(0, 1, 1000, 10);
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(cut.status().message(), ::testing::HasSubstr("failed:"));
  // Host 1 reaches host 0, but host 0's answers never come back: silence
  // until the client's timeout.
  absl::StatusOr<std::pair<int64_t, double>> silent = Send(1, 0, 1000, 1);
  ASSERT_FALSE(silent.ok());
  EXPECT_THAT(silent.status().message(), ::testing::HasSubstr("timed out"));
  // Other paths are untouched, and healing restores the cut one.
  EXPECT_TRUE(Send(2, 1, 1000).ok());
  ASSERT_TRUE(hosts_->Heal(0, 1).ok());
  absl::StatusOr<std::pair<int64_t, double>> healed = Send(0, 1, 1000);
  ASSERT_TRUE(healed.ok()) << healed.status();
  EXPECT_EQ(healed->first, 1000);
}

TEST_F(NetnsHostsTest, ADownedLinkIsSilentBothWays) {
  ASSERT_TRUE(hosts_->SetLinkUp(1, false).ok());
  EXPECT_FALSE(Send(0, 1, 1000, 1).ok());
  EXPECT_FALSE(Send(1, 0, 1000, 1).ok());
  ASSERT_TRUE(hosts_->SetLinkUp(1, true).ok());
  absl::StatusOr<std::pair<int64_t, double>> up = Send(0, 1, 1000);
  EXPECT_TRUE(up.ok()) << up.status();
}

TEST_F(NetnsHostsTest, ARateLimitHolds) {
  // 20 Mbit/s: 4 MB take at least 1.6 s (less a burst of 64 KiB), where
  // unshaped they take milliseconds. Only the lower bound is checked.
  ASSERT_TRUE(hosts_->LimitRate(1, 20'000'000).ok());
  constexpr int64_t kBytes = 4'000'000;
  absl::StatusOr<std::pair<int64_t, double>> shaped = Send(0, 1, kBytes, 30);
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  EXPECT_EQ(shaped->first, kBytes);
  EXPECT_GE(shaped->second, 1.4) << "4 MB through a 20 Mbit/s link";
  std::printf("4 MB over a 20 Mbit/s link: %.2f s (%.1f Mbit/s)\n", shaped->second,
              kBytes * 8 / shaped->second / 1e6);
  ASSERT_TRUE(hosts_->LimitRate(1, 0).ok());
}

TEST(NetnsHostsCleanupTest, NothingIsLeftBehind) {
  absl::StatusOr<std::unique_ptr<NetnsHosts>> hosts = NetnsHosts::Create(2);
  if (absl::IsUnavailable(hosts.status())) GTEST_SKIP() << hosts.status().message();
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  const std::string ns0 = (*hosts)->ns(0);
  hosts->reset();
  absl::StatusOr<CommandResult> namespaces = RunCommand("ip", {"netns", "list"}, absl::Seconds(10));
  ASSERT_TRUE(namespaces.ok());
  EXPECT_THAT(namespaces->output, ::testing::Not(::testing::HasSubstr(ns0)));
  absl::StatusOr<CommandResult> links = RunCommand("ip", {"-o", "link", "show"}, absl::Seconds(10));
  ASSERT_TRUE(links.ok());
  EXPECT_THAT(links->output,
              ::testing::Not(::testing::HasSubstr(absl::StrCat("cb", ::getpid(), ":"))));
  EXPECT_THAT(links->output,
              ::testing::Not(::testing::HasSubstr(absl::StrCat("cv", ::getpid(), "h"))));
}

}  // namespace
}  // namespace cohort::testing
