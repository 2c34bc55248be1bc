// Tests for tests/testing: ports, HTTP, paths and WaitUntil.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/net.h"
#include "tests/testing/paths.h"
#include "tests/testing/wait.h"

namespace cohort::testing {
namespace {

TEST(PickFreePortTest, PortIsBindable) {
  const int port = PickFreePort();
  ASSERT_GT(port, 0);
  ASSERT_LT(port, 65536);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
}

// A one-connection HTTP server on 127.0.0.1 that answers with `response`.
class OneShotServer {
 public:
  explicit OneShotServer(std::string response) : response_(std::move(response)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~OneShotServer() {
    thread_.join();
    ::close(fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  const std::string& request() const { return request_; }  // after the GET returned

 private:
  void Serve() {
    const int conn = ::accept(fd_, nullptr, nullptr);
    if (conn < 0) return;
    char buf[4096];
    while (!absl::StrContains(request_, "\r\n\r\n")) {
      const ssize_t n = ::recv(conn, buf, sizeof(buf), 0);
      if (n <= 0) break;
      request_.append(buf, static_cast<size_t>(n));
    }
    ssize_t ignored = ::send(conn, response_.data(), response_.size(), MSG_NOSIGNAL);
    (void)ignored;
    ::close(conn);
  }

  std::string response_;
  int fd_ = -1;
  int port_ = 0;
  std::string request_;
  std::thread thread_;
};

TEST(HttpGetTest, ReturnsBodyOn200) {
  OneShotServer server(
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\ncohort_workers 3\ncohort_jobs 1\n");
  absl::StatusOr<std::string> body = HttpGet(server.address(), "/metrics", absl::Seconds(10));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "cohort_workers 3\ncohort_jobs 1\n");
  EXPECT_TRUE(absl::StartsWith(server.request(), "GET /metrics HTTP/1.0\r\n"));
}

TEST(HttpGetTest, Non200IsAnError) {
  OneShotServer server("HTTP/1.1 404 Not Found\r\n\r\nnope");
  absl::StatusOr<std::string> body = HttpGet(server.address(), "/x", absl::Seconds(10));
  EXPECT_EQ(body.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(body.status().message(), "404"));
}

TEST(HttpGetTest, ClosedPortIsUnavailable) {
  const int port = PickFreePort();
  absl::StatusOr<std::string> body =
      HttpGet(absl::StrCat("127.0.0.1:", port), "/metrics", absl::Seconds(5));
  EXPECT_EQ(body.status().code(), absl::StatusCode::kUnavailable);
}

TEST(WaitUntilTest, TrueWhenConditionBecomesTrue) {
  std::atomic<int> calls{0};
  EXPECT_TRUE(WaitUntil([&] { return ++calls >= 3; }, absl::Seconds(10), absl::Milliseconds(1)));
  EXPECT_EQ(calls.load(), 3);
}

TEST(WaitUntilTest, FalseOnTimeout) {
  const absl::Time start = absl::Now();
  EXPECT_FALSE(WaitUntil([] { return false; }, absl::Milliseconds(30), absl::Milliseconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
}

TEST(PathsTest, BinaryPathMapsProjectBinaries) {
  const std::string dir = BinaryDir();
  EXPECT_EQ(BinaryPath("cohort-coordinator"), dir + "/coordinator/cohort-coordinator");
  EXPECT_EQ(BinaryPath("cohort-worker"), dir + "/worker/cohort-worker");
  EXPECT_EQ(BinaryPath("cohortctl"), dir + "/tools/cohortctl");
  EXPECT_EQ(BinaryPath("cohort-sim"), dir + "/tools/cohort-sim");
}

TEST(PathsTest, BinaryDirMatchesBuildTree) {
  // Without the env override, the runtime lookup must agree with CMake.
  const char* saved = std::getenv("COHORT_BINARY_DIR");
  ::unsetenv("COHORT_BINARY_DIR");
  EXPECT_EQ(BinaryDir(), COHORT_BINARY_DIR);
  ::setenv("COHORT_BINARY_DIR", "/some/build", 1);
  EXPECT_EQ(BinaryPath("cohortctl"), "/some/build/tools/cohortctl");
  if (saved != nullptr) {
    ::setenv("COHORT_BINARY_DIR", saved, 1);
  } else {
    ::unsetenv("COHORT_BINARY_DIR");
  }
}

TEST(PathsTest, ProgramsComeFromTheSanitizerBuildWhereItHasThem) {
  const std::string programs = MakeTempDir("programs");
  ASSERT_EQ(::mkdir((programs + "/coordinator").c_str(), 0755), 0);
  const std::string coordinator = programs + "/coordinator/cohort-coordinator";
  { std::ofstream(coordinator) << "#!/bin/sh\n"; }
  ASSERT_EQ(::chmod(coordinator.c_str(), 0755), 0);
  ::setenv("COHORT_TEST_PROGRAMS_DIR", programs.c_str(), 1);
  EXPECT_EQ(BinaryPath("cohort-coordinator"), coordinator);
  EXPECT_TRUE(ProgramsAreSanitized());
  // Not in that build: the test's own.
  EXPECT_EQ(BinaryPath("cohort-worker"), BinaryDir() + "/worker/cohort-worker");
  ::unsetenv("COHORT_TEST_PROGRAMS_DIR");
  EXPECT_EQ(BinaryPath("cohort-coordinator"), BinaryDir() + "/coordinator/cohort-coordinator");
  EXPECT_FALSE(ProgramsAreSanitized());
}

TEST(PathsTest, MakeTempDirCreatesFreshDirectories) {
  const std::string a = MakeTempDir("paths_test");
  const std::string b = MakeTempDir("paths_test");
  EXPECT_NE(a, b);
  struct stat st {};
  ASSERT_EQ(::stat(a.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_TRUE(absl::StrContains(a, "paths_test"));
}

}  // namespace
}  // namespace cohort::testing
