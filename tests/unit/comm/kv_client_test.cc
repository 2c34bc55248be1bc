// Tests for NewCoordinatorKvClient against FakeKvServer (a real gRPC server
// on loopback).
#include "worker/comm/kv_client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_kv_server.h"
#include "tests/testing/net.h"
#include "tests/testing/wait.h"

namespace cohort::comm {
namespace {

using ::cohort::testing::FakeKvServer;
using ::cohort::testing::PickFreePort;
using ::cohort::testing::WaitUntil;

std::unique_ptr<FakeKvServer> StartServer(FakeKvServer::Options options = {}) {
  auto server = FakeKvServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::string Address(int port) { return absl::StrCat("127.0.0.1:", port); }

// A listener on 127.0.0.1:`port` that accepts connections and closes them at
// once, so a gRPC client sees each attempt fail (Unavailable) and the test can
// count the attempts. Stands in for a coordinator that is down.
class RefusingListener {
 public:
  explicit RefusingListener(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ok_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
          ::listen(fd_, 16) == 0;
  }
  ~RefusingListener() { Close(); }
  bool ok() const { return ok_; }

  // Accepts and drops `n` connections; false if they do not come within
  // `timeout`.
  bool RefuseConnections(int n, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (int i = 0; i < n; ++i) {
      pollfd p{fd_, POLLIN, 0};
      const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (ms <= 0 || ::poll(&p, 1, ms) != 1) return false;
      const int conn = ::accept(fd_, nullptr, nullptr);
      if (conn < 0) return false;
      ::close(conn);
    }
    return true;
  }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

TEST(CoordinatorKvClientTest, SetThenWaitFor) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto writer = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 3});
  auto reader = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 3});
  ASSERT_TRUE(writer->Set("addr/0", std::string("\x01\x00\x02", 3)).ok());
  absl::StatusOr<std::string> value = reader->WaitFor("addr/0", absl::Seconds(5));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("\x01\x00\x02", 3));
}

TEST(CoordinatorKvClientTest, WaitForTimesOut) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto client = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1});
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = client->WaitFor("missing", absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded) << value.status();
  EXPECT_GE(took, absl::Milliseconds(100));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(CoordinatorKvClientTest, ScopesAreIsolated) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto gen1 = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1});
  auto gen2 = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 2});
  ASSERT_TRUE(gen1->Set("k", "one").ok());
  EXPECT_EQ(gen2->WaitFor("k", absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(gen2->Set("k", "two").ok());
  EXPECT_EQ(gen1->WaitFor("k", absl::Seconds(5)).value_or(""), "one");
  EXPECT_EQ(gen2->WaitFor("k", absl::Seconds(5)).value_or(""), "two");
}

TEST(CoordinatorKvClientTest, WaiterReleasedBySetFromAnotherClient) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto reader = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1});
  std::optional<absl::StatusOr<std::string>> result;
  std::jthread waiter([&] { result = reader->WaitFor("late", absl::Seconds(20)); });
  ASSERT_TRUE(WaitUntil([&] { return server->waiting() == 1; }, absl::Seconds(10)));
  auto writer = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1});
  ASSERT_TRUE(writer->Set("late", "value").ok());
  waiter.join();
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ(**result, "value");
}

// A caller's timeout longer than the server's cap on one request is served by
// several WaitFor requests.
TEST(CoordinatorKvClientTest, WaitsAcrossServerCap) {
  FakeKvServer::Options options;
  options.max_wait = absl::Milliseconds(20);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto reader = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1});
  std::optional<absl::StatusOr<std::string>> result;
  std::jthread waiter([&] { result = reader->WaitFor("k", absl::Seconds(20)); });
  ASSERT_TRUE(WaitUntil([&] { return server->wait_requests() >= 3; }, absl::Seconds(10)));
  ASSERT_TRUE(NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1})->Set("k", "v").ok());
  waiter.join();
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ(**result, "v");
}

TEST(CoordinatorKvClientTest, AbortedWhenGenerationEnds) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto client = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 7});
  std::optional<absl::StatusOr<std::string>> result;
  std::jthread waiter([&] { result = client->WaitFor("never", absl::Seconds(20)); });
  ASSERT_TRUE(WaitUntil([&] { return server->waiting() == 1; }, absl::Seconds(10)));
  const absl::Time start = absl::Now();
  server->DropGeneration("job", 7);
  waiter.join();
  EXPECT_EQ(result->status().code(), absl::StatusCode::kAborted) << result->status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Final: not retried.
  EXPECT_EQ(client->Set("k", "v").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(server->set_requests(), 1);
}

TEST(CoordinatorKvClientTest, InvalidArgumentKeepsItsCode) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto client = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1});
  absl::Status status = client->Set("", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(client->WaitFor("", absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto no_generation = NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 0});
  EXPECT_EQ(no_generation->Set("k", "v").code(), absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorKvClientTest, UnreachableServerIsDeadlineExceededWithinTimeout) {
  auto client = NewCoordinatorKvClient(CoordinatorTarget::Insecure(Address(PickFreePort())), {"job", 1});
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = client->WaitFor("k", absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded) << value.status();
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(3));
}

// The client starts waiting while the coordinator is down (its connections
// fail), keeps retrying, and gets the value once a server comes up there.
TEST(CoordinatorKvClientTest, WaitForRetriesUntilServerComesUp) {
  const int port = PickFreePort();
  RefusingListener down(port);
  ASSERT_TRUE(down.ok());
  auto reader = NewCoordinatorKvClient(CoordinatorTarget::Insecure(Address(port)), {"job", 1});
  std::optional<absl::StatusOr<std::string>> result;
  std::jthread waiter([&] { result = reader->WaitFor("k", absl::Seconds(30)); });
  // Two failed connection attempts: the client retried at least once.
  ASSERT_TRUE(down.RefuseConnections(2, absl::Seconds(10)));
  down.Close();
  FakeKvServer::Options options;
  options.port = port;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return server->waiting() == 1; }, absl::Seconds(10)));
  ASSERT_TRUE(NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1})->Set("k", "up").ok());
  waiter.join();
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ(**result, "up");
}

TEST(CoordinatorKvClientTest, SetRetriesUntilServerComesUp) {
  const int port = PickFreePort();
  RefusingListener down(port);
  ASSERT_TRUE(down.ok());
  auto writer = NewCoordinatorKvClient(CoordinatorTarget::Insecure(Address(port)), {"job", 1});
  absl::Status set_status = absl::UnknownError("not run");
  std::jthread setter([&] { set_status = writer->Set("k", "eventually"); });
  ASSERT_TRUE(down.RefuseConnections(2, absl::Seconds(5)));
  down.Close();
  FakeKvServer::Options options;
  options.port = port;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  setter.join();
  ASSERT_TRUE(set_status.ok()) << set_status;
  EXPECT_EQ(NewCoordinatorKvClient(CoordinatorTarget::Insecure(server->address()), {"job", 1})
                ->WaitFor("k", absl::Seconds(5))
                .value_or(""),
            "eventually");
}

}  // namespace
}  // namespace cohort::comm
