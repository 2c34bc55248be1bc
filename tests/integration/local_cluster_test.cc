// The test cluster's own start-up: a port that PickFreePort chose but
// something else took before the coordinator bound it (a test running
// beside this one) moves the first start to a fresh port, instead of a
// coordinator that never comes up and a test that runs into its timeout.

#include "tests/integration/local_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/numbers.h"
#include "gtest/gtest.h"

namespace cohort::testing {
namespace {

TEST(LocalClusterTest, ATakenPortMovesTheFirstStartToAnother) {
  LocalCluster cluster("taken-port");
  const std::string before = cluster.address();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(before.substr(before.rfind(':') + 1), &port)) << before;
  // Take the cluster's port first.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);

  cluster.StartCoordinator();
  ::close(fd);
  EXPECT_FALSE(HasFatalFailure());
  EXPECT_NE(cluster.address(), before) << "the start should have moved off the taken port";
  EXPECT_EQ(cluster.CountWorkers(v1::WORKER_STATE_IDLE), 0);
}

}  // namespace
}  // namespace cohort::testing
