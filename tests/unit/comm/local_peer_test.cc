#include "worker/comm/local_peer.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/wait.h"

namespace cohort::comm {
namespace {

TEST(LocalPeerTest, SelfIsAliveAndRoundTripsThroughTheAddressRecord) {
  const ProcessIdentity self = SelfIdentity();
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_GT(self.start_ticks, 0u);
  EXPECT_FALSE(self.host.empty());
  EXPECT_FALSE(ProcessGone(self));
  const std::string blob("\x01\x00\nbinary\nucx", 13);
  auto decoded = DecodePeerAddress(EncodePeerAddress(self, blob));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->first.host, self.host);
  EXPECT_EQ(decoded->first.pid, self.pid);
  EXPECT_EQ(decoded->first.start_ticks, self.start_ticks);
  EXPECT_EQ(decoded->second, blob);
  EXPECT_EQ(DecodePeerAddress("plain ucx blob").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalPeerTest, AnotherNetworkNamespaceIsAnotherHost) {
  // A child in a network namespace of its own: peers there are reached over
  // the network, so it must not count as this host.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    const std::string host = ::unshare(CLONE_NEWNET) == 0 ? SelfIdentity().host : "";
    (void)!::write(fds[1], host.data(), host.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string host;
  char buffer[512];
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof(buffer))) > 0) host.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  if (host.empty()) GTEST_SKIP() << "cannot make a network namespace here (not root)";
  EXPECT_NE(host, SelfIdentity().host);
}

TEST(LocalPeerTest, AKilledProcessIsGoneEvenBeforeItIsReaped) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ProcessIdentity identity = SelfIdentity();
  identity.pid = child;
  // The child's own start time, as its peers would have read it.
  ProcessIdentity probe = identity;
  probe.start_ticks = 0;
  ASSERT_TRUE(ProcessGone(probe));  // wrong start time: treated as another process
  ::kill(child, SIGSTOP);           // stays alive but stopped: still not gone
  // Read the real start time through a fresh identity of the child.
  {
    std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 22; ++i) fields >> field;
    identity.start_ticks = std::stoull(field);
  }
  EXPECT_FALSE(ProcessGone(identity));
  ::kill(child, SIGKILL);
  // Not reaped yet: a zombie counts as gone. Poll until the kernel has
  // turned it into one.
  EXPECT_TRUE(testing::WaitUntil([&] { return ProcessGone(identity); }, absl::Seconds(1),
                                 absl::Milliseconds(1)));
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(ProcessGone(identity));
}

}  // namespace
}  // namespace cohort::comm
