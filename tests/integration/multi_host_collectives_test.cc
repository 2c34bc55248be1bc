// Collectives across network namespaces (NetnsHosts): four ranks whose
// group ranks alternate between two hosts (0 and 2 on host 0, 1 and 3 on
// host 1), running the "collectives" scenario (every collective at every
// size against its reference, bitwise equal on every rank):
//   - flat: the ring algorithms run on the channel's ring, grouped host by
//     host (0, 2, 1, 3), so the ring crosses between the hosts once each way;
//   - hierarchical: all-reduces go local reduce-scatter, lane all-reduce,
//     local all-gather (HierarchicalCommunicator), with the local and lane
//     groups picked out of the alternating ranks.
// Skips where namespaces cannot be made.

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_kv_server.h"
#include "tests/testing/netns_hosts.h"
#include "tests/testing/testing.h"

namespace cohort::testing {
namespace {

constexpr int kRanks = 4;

// Runs the scenario with --algorithm=`algorithm` on ranks alternating
// between two hosts; returns each rank's log once all exited 0, or skips.
void RunAlternating(const std::string& algorithm, std::vector<std::string>* logs,
                    uint64_t* link_bytes) {
  absl::StatusOr<std::unique_ptr<NetnsHosts>> made = NetnsHosts::Create(2);
  if (absl::IsUnavailable(made.status())) GTEST_SKIP() << made.status().message();
  ASSERT_TRUE(made.ok()) << made.status();
  NetnsHosts& hosts = **made;
  FakeKvServer::Options kv_options;
  kv_options.host = hosts.gateway();
  absl::StatusOr<std::unique_ptr<FakeKvServer>> kv = FakeKvServer::Start(kv_options);
  ASSERT_TRUE(kv.ok()) << kv.status();
  const std::string dir = MakeTempDir("multihost-collectives");
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    Subprocess::Options options;
    std::tie(options.binary, options.args) = hosts.Command(
        r % 2, BinaryPath("tests/cohort-comm-test-rank"),
        {"--kv=" + (*kv)->address(), absl::StrCat("--rank=", r), absl::StrCat("--size=", kRanks),
         "--scenario=collectives", "--seed=23", "--algorithm=" + algorithm});
    options.env = {{"UCX_WARN_UNUSED_ENV_VARS", "n"}};
    options.log_path = absl::StrCat(dir, "/rank", r, ".log");
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(options);
    ASSERT_TRUE(p.ok()) << p.status();
    ranks.push_back(std::move(*p));
  }
  for (int r = 0; r < kRanks; ++r) {
    absl::StatusOr<int> code = ranks[r]->Wait(absl::Seconds(180));
    logs->push_back(ranks[r]->ReadLog());
    ASSERT_TRUE(code.ok()) << "rank " << r << " still running:\n" << logs->back();
    ASSERT_EQ(*code, 0) << "rank " << r << ":\n" << logs->back();
  }
  *link_bytes = hosts.LinkBytes(0);
}

TEST(MultiHostCollectivesTest, RanksAlternatingBetweenHostsRingHostByHostAndMatchTheReference) {
  std::vector<std::string> logs;
  uint64_t link_bytes = 0;
  RunAlternating("flat", &logs, &link_bytes);
  if (IsSkipped() || HasFatalFailure()) return;
  const int expected_position[kRanks] = {0, 2, 1, 3};
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_NE(logs[r].find(absl::StrCat("rank ", r, ": ring position ", expected_position[r])),
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
  if (IsSkipped() || HasFatalFailure()) return;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_NE(logs[r].find(absl::StrCat("rank ", r, ": hierarchical collectives over 2 hosts")),
              std::string::npos)
        << "rank " << r << ":\n" << logs[r];
  }
  std::printf("hierarchical, ranks alternating between 2 hosts: collectives match their "
              "references; %.1f MB crossed host 0's link\n",
              static_cast<double>(link_bytes) / 1e6);
}

}  // namespace
}  // namespace cohort::testing
