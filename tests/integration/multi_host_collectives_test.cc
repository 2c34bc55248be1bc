// Collectives across network namespaces (NetnsHosts): four ranks whose
// group ranks alternate between two hosts (0 and 2 on host 0, 1 and 3 on
// host 1), running the "collectives" scenario (every collective at every
// size against its reference, bitwise equal on every rank):
//   - flat: the ring algorithms run on the channel's ring, grouped host by
//     host (0, 2, 1, 3), so the ring crosses between the hosts once each way;
//   - hierarchical: large collectives go through this host's ranks and the
//     lanes across hosts (HierarchicalCommunicator), with the local and lane
//     groups picked out of the alternating ranks. An ordered reduce-scatter
//     whose order folds each host first ("strided" here) runs hierarchically
//     and is bitwise the order's; one that does not ("adjacent") is left to
//     the caller's point-to-point exchange, as on the flat group.
// Skips where namespaces cannot be made.

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_kv_server.h"
#include "tests/testing/netns_hosts.h"
#include "tests/testing/testing.h"

namespace cohort::testing {
namespace {

constexpr int kRanks = 4;
// The scenario's size above kHierarchicalMinBytes (2^20 + 3 floats).
constexpr size_t kLargeCount = (size_t{1} << 20) + 3;

constexpr int kCommError = 3;  // RankExit::kCommError

// Four ranks of `scenario` alternating between two namespace hosts, with a
// key-value server on the test's own way in; skips where namespaces cannot
// be made.
class AlternatingRanks {
 public:
  // `ranks` ranks, rank r on host r % `host_count`.
  void Start(const std::string& scenario, const std::vector<std::string>& extra,
             int host_count = 2, int ranks = kRanks) {
    absl::StatusOr<std::unique_ptr<NetnsHosts>> made = NetnsHosts::Create(host_count);
    if (absl::IsUnavailable(made.status())) GTEST_SKIP() << made.status().message();
    ASSERT_TRUE(made.ok()) << made.status();
    hosts_ = std::move(*made);
    FakeKvServer::Options kv_options;
    kv_options.host = hosts_->gateway();
    absl::StatusOr<std::unique_ptr<FakeKvServer>> kv = FakeKvServer::Start(kv_options);
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    const std::string dir = MakeTempDir("multihost-" + scenario);
    for (int r = 0; r < ranks; ++r) {
      Subprocess::Options options;
      std::vector<std::string> args = {"--kv=" + kv_->address(), absl::StrCat("--rank=", r),
                                       absl::StrCat("--size=", ranks), "--scenario=" + scenario,
                                       "--seed=23", absl::StrCat("--stride=", host_count)};
      args.insert(args.end(), extra.begin(), extra.end());
      std::tie(options.binary, options.args) =
          hosts_->Command(r % host_count, BinaryPath("tests/cohort-comm-test-rank"), args);
      options.env = {{"UCX_WARN_UNUSED_ENV_VARS", "n"}};
      options.log_path = absl::StrCat(dir, "/rank", r, ".log");
      absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(options);
      ASSERT_TRUE(p.ok()) << p.status();
      ranks_.push_back(std::move(*p));
    }
  }

  Subprocess& rank(int r) { return *ranks_[r]; }
  NetnsHosts& hosts() { return *hosts_; }

  // Rank r's exit code (a failure if it is still running after `limit`).
  int Wait(int r, absl::Duration limit) {
    absl::StatusOr<int> code = ranks_[r]->Wait(limit);
    EXPECT_TRUE(code.ok()) << "rank " << r << " still running:\n" << ranks_[r]->ReadLog();
    return code.ok() ? *code : -1;
  }

 private:
  std::unique_ptr<NetnsHosts> hosts_;  // outlives the ranks (destroyed last)
  std::unique_ptr<FakeKvServer> kv_;
  std::vector<std::unique_ptr<Subprocess>> ranks_;
};

// Runs the "collectives" scenario with --algorithm=`algorithm`; returns each
// rank's log once all exited 0, or skips.
void RunAlternating(const std::string& algorithm, std::vector<std::string>* logs,
                    uint64_t* link_bytes) {
  AlternatingRanks ranks;
  ranks.Start("collectives", {"--algorithm=" + algorithm});
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  for (int r = 0; r < kRanks; ++r) {
    const int code = ranks.Wait(r, absl::Seconds(180));
    logs->push_back(ranks.rank(r).ReadLog());
    ASSERT_EQ(code, 0) << "rank " << r << ":\n" << logs->back();
  }
  *link_bytes = ranks.hosts().LinkBytes(0);
}

TEST(MultiHostCollectivesTest, RanksAlternatingBetweenHostsRingHostByHostAndMatchTheReference) {
  std::vector<std::string> logs;
  uint64_t link_bytes = 0;
  RunAlternating("flat", &logs, &link_bytes);
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  const int expected_position[kRanks] = {0, 2, 1, 3};
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_NE(logs[r].find(absl::StrCat("rank ", r, ": ring position ", expected_position[r])),
              std::string::npos)
        << "rank " << r << ":\n" << logs[r];
    EXPECT_NE(logs[r].find(absl::StrCat("rank ", r, ": ordered reduce-scatter strided n=",
                                        kLargeCount, ": left to the caller")),
              std::string::npos)
        << "rank " << r << ":\n" << logs[r];
  }
  std::printf("flat, ranks alternating between 2 hosts: collectives match their references on "
              "the host-by-host ring; %.1f MB crossed host 0's link\n",
              static_cast<double>(link_bytes) / 1e6);
}

TEST(MultiHostCollectivesTest, HierarchicalCollectivesOverAlternatingRanksMatchTheReference) {
  std::vector<std::string> logs;
  uint64_t link_bytes = 0;
  RunAlternating("hierarchical", &logs, &link_bytes);
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_NE(logs[r].find(absl::StrCat("rank ", r, ": hierarchical collectives over 2 hosts")),
              std::string::npos)
        << "rank " << r << ":\n" << logs[r];
    EXPECT_NE(logs[r].find(absl::StrCat("rank ", r, ": ordered reduce-scatter strided n=",
                                        kLargeCount, ": exact")),
              std::string::npos)
        << "rank " << r << ":\n" << logs[r];
    EXPECT_NE(logs[r].find(absl::StrCat("rank ", r, ": ordered reduce-scatter adjacent n=",
                                        kLargeCount, ": left to the caller")),
              std::string::npos)
        << "rank " << r << ":\n" << logs[r];
  }
  std::printf("hierarchical, ranks alternating between 2 hosts: collectives match their "
              "references; %.1f MB crossed host 0's link\n",
              static_cast<double>(link_bytes) / 1e6);
}

TEST(MultiHostCollectivesTest, AKilledRankFailsTheHierarchicalAllReduceOnEverySurvivor) {
  // 64 MiB all-reduces through the local groups and the lanes: a kill must
  // end every survivor's call within its timeout (Unavailable from the
  // peer's loss, or a wait on a peer that is itself failing), and every
  // later call must fail the same way.
  const absl::Duration call_timeout = absl::Seconds(5);
  AlternatingRanks ranks;
  ranks.Start("kill", {"--algorithm=hierarchical",
                       absl::StrCat("--timeout_ms=", absl::ToInt64Milliseconds(call_timeout)),
                       absl::StrCat("--max_elements=", 16 << 20)});
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  for (int r = 0; r < kRanks; ++r) {
    absl::StatusOr<std::string> line =
        WaitForLogLine(ranks.rank(r), "entered allreduce loop", absl::Seconds(60));
    ASSERT_TRUE(line.ok()) << line.status() << "\n" << ranks.rank(r).ReadLog();
  }
  constexpr int kVictim = 1;
  const absl::Time killed = absl::Now();
  ranks.rank(kVictim).Kill();
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    const int code = ranks.Wait(r, call_timeout + absl::Seconds(5));
    const std::string log = ranks.rank(r).ReadLog();
    EXPECT_EQ(code, kCommError) << "rank " << r << ":\n" << log;
    EXPECT_EQ(log.find("MISMATCH"), std::string::npos) << "rank " << r << ":\n" << log;
    std::printf("rank %d (%s host) failed %.0f ms after the kill\n", r,
                r % 2 == kVictim % 2 ? "the victim's" : "the other",
                absl::ToDoubleMilliseconds(absl::Now() - killed));
  }
}

TEST(MultiHostCollectivesTest, ThreeHostsOfTwoRanksRunEveryCollectiveHierarchically) {
  // 6 ranks, rank r on host r % 3: lanes of three members (two exchange
  // rounds, a three-way fold of the hosts' ordered partial sums), the
  // restaging of 6 blocks lane by lane, ranges gathered over 3 hosts, and
  // pipelined all-reduces of two pieces (the second a few elements, padded)
  // over lanes of three. Sizes up to 1 Mi + 3 elements (4 MiB of floats,
  // 8 MiB of int64: 1-2 s unloaded), so that 6 processes on a busy 2-core
  // machine finish well within the calls' 30 s timeouts.
  constexpr int kHosts = 3, kSix = 6;
  constexpr size_t kCount = (size_t{1} << 20) + 3;
  AlternatingRanks ranks;
  ranks.Start("collectives",
              {"--algorithm=hierarchical", absl::StrCat("--max_elements=", kCount)}, kHosts,
              kSix);
  if (IsSkipped() || HasFatalFailure()) return;
  for (int r = 0; r < kSix; ++r) {
    const int code = ranks.Wait(r, absl::Seconds(180));
    const std::string log = ranks.rank(r).ReadLog();
    ASSERT_EQ(code, 0) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find(absl::StrCat("rank ", r, ": hierarchical collectives over 3 hosts")),
              std::string::npos)
        << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find(absl::StrCat("rank ", r, ": ordered reduce-scatter strided n=", kCount,
                                    ": exact")),
              std::string::npos)
        << "rank " << r << ":\n" << log;
  }
}

}  // namespace
}  // namespace cohort::testing
