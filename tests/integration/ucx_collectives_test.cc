// Multi-process tests of UcxCommunicator: N cohort-comm-test-rank processes
// bootstrap through a FakeKvServer and run a scenario; parameterised over
// transports (TCP loopback, shared memory) and group sizes.

#include <signal.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_kv_server.h"
#include "tests/testing/testing.h"

namespace cohort::testing {
namespace {

constexpr int kCommError = 3;  // RankExit::kCommError

std::vector<std::pair<std::string, std::string>> TransportEnv(const std::string& transport) {
  std::vector<std::pair<std::string, std::string>> env = {{"UCX_WARN_UNUSED_ENV_VARS", "n"}};
  if (transport == "tcp") {
    env.push_back({"UCX_TLS", "tcp"});
    env.push_back({"UCX_NET_DEVICES", "lo"});
  } else if (transport == "default") {
    // Cohort's own choice with UCX_TLS unset: every transport but cma, with
    // same-host peers on shared memory watched through /proc. (A UCX_TLS in
    // the test's own environment would be inherited and override this.)
  } else {
    // posix shared memory without CMA: UCX 1.13's shared-memory transports
    // have no peer failure handler, and with error handling off a CMA copy
    // from a killed peer aborts the process instead of timing out.
    env.push_back({"UCX_TLS", "posix,self"});
  }
  return env;
}

class RankGroup {
 public:
  // Starts `n` ranks of `scenario` against a fresh FakeKvServer.
  void Start(const std::string& transport, int n, const std::string& scenario,
             std::vector<std::string> extra = {}) {
    absl::StatusOr<std::unique_ptr<FakeKvServer>> kv = FakeKvServer::Start();
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    const std::string dir = MakeTempDir("ucx-" + scenario);
    for (int r = 0; r < n; ++r) {
      Subprocess::Options options;
      options.binary = BinaryPath("tests/cohort-comm-test-rank");
      options.args = {"--kv=" + kv_->address(), absl::StrCat("--rank=", r),
                      absl::StrCat("--size=", n), "--scenario=" + scenario, "--seed=17"};
      options.args.insert(options.args.end(), extra.begin(), extra.end());
      options.env = TransportEnv(transport);
      options.log_path = absl::StrCat(dir, "/rank", r, ".log");
      absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(options);
      ASSERT_TRUE(p.ok()) << p.status();
      ranks_.push_back(std::move(*p));
    }
  }

  Subprocess& rank(int r) { return *ranks_[r]; }
  int size() const { return static_cast<int>(ranks_.size()); }

  // Waits for rank r; returns its exit code (-1 on timeout) and logs on a
  // surprise.
  int Wait(int r, absl::Duration timeout, int want) {
    absl::StatusOr<int> code = ranks_[r]->Wait(timeout);
    const int got = code.ok() ? *code : -1;
    EXPECT_EQ(got, want) << "rank " << r << " (" << (code.ok() ? "exited" : "still running")
                         << "), log:\n"
                         << ranks_[r]->ReadLog();
    return got;
  }

 private:
  std::unique_ptr<FakeKvServer> kv_;
  std::vector<std::unique_ptr<Subprocess>> ranks_;
};

using Params = std::tuple<std::string, int>;

class UcxCollectivesTest : public ::testing::TestWithParam<Params> {};

TEST_P(UcxCollectivesTest, AllSizesMatchReferenceAndAgreeBitwise) {
  const auto& [transport, n] = GetParam();
  RankGroup group;
  ASSERT_NO_FATAL_FAILURE(group.Start(transport, n, "collectives"));
  for (int r = 0; r < n; ++r) group.Wait(r, absl::Seconds(120), 0);
  // The bandwidth lines of rank 0, for the record.
  const std::string log = group.rank(0).ReadLog();
  for (size_t at = log.find("BANDWIDTH"); at != std::string::npos;
       at = log.find("BANDWIDTH", at + 1)) {
    std::printf("[%s x%d] %s\n", transport.c_str(), n,
                log.substr(at, log.find('\n', at) - at).c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxCollectivesTest,
                         ::testing::Combine(::testing::Values("tcp", "sm", "default"),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<Params>& info) {
                           return absl::StrCat(std::get<0>(info.param), "_",
                                               std::get<1>(info.param), "ranks");
                         });

class UcxTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxTransportTest, SendRecvOrderAndTagIsolation) {
  RankGroup group;
  ASSERT_NO_FATAL_FAILURE(group.Start(GetParam(), 3, "p2p"));
  for (int r = 0; r < 3; ++r) group.Wait(r, absl::Seconds(60), 0);
}

TEST_P(UcxTransportTest, TwoGenerationsInARow) {
  RankGroup group;
  ASSERT_NO_FATAL_FAILURE(group.Start(GetParam(), 2, "generations"));
  for (int r = 0; r < 2; ++r) group.Wait(r, absl::Seconds(60), 0);
}

TEST_P(UcxTransportTest, KilledRankTurnsIntoErrorOnSurvivors) {
  constexpr int kRanks = 3;
  constexpr int kVictim = 1;
  const absl::Duration call_timeout = absl::Seconds(5);
  RankGroup group;
  ASSERT_NO_FATAL_FAILURE(group.Start(
      GetParam(), kRanks, "kill",
      {absl::StrCat("--timeout_ms=", absl::ToInt64Milliseconds(call_timeout)),
       absl::StrCat("--max_elements=", 16 << 20)}));
  for (int r = 0; r < kRanks; ++r) {
    absl::StatusOr<std::string> line =
        WaitForLogLine(group.rank(r), "entered allreduce loop", absl::Seconds(60));
    ASSERT_TRUE(line.ok()) << line.status();
  }
  const absl::Time killed = absl::Now();
  group.rank(kVictim).Kill();
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    // Within the call timeout (plus start-up slack for the check itself).
    group.Wait(r, call_timeout + absl::Seconds(5), kCommError);
    std::printf("[%s] rank %d failed %.0f ms after the kill: %s\n", GetParam().c_str(), r,
                absl::ToDoubleMilliseconds(absl::Now() - killed),
                group.rank(r).ReadLog().find("UNAVAILABLE") != std::string::npos
                    ? "Unavailable"
                    : "DeadlineExceeded");
  }
  EXPECT_EQ(group.Wait(kVictim, absl::Seconds(5), 128 + SIGKILL), 128 + SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportTest,
                         ::testing::Values("tcp", "sm", "default"));

}  // namespace
}  // namespace cohort::testing
