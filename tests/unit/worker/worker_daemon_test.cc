#include "worker/agent/worker_daemon.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::worker {
namespace {

using ::testing::HasSubstr;

// GET http://127.0.0.1:<port>/metrics with a plain socket; empty on failure.
std::string FetchMetrics(const std::string& address) {
  const std::vector<std::string> parts = absl::StrSplit(address, ':');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port)) return "";
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
    }
  }
  ::close(fd);
  return response;
}

TEST(WorkerDaemonTest, DefaultWorkerIdNamesHostDeviceAndIndex) {
  EXPECT_EQ(DefaultWorkerId("node7", v1::DEVICE_KIND_GPU, 3), "node7-gpu-3");
  EXPECT_EQ(DefaultWorkerId("127.0.0.1", v1::DEVICE_KIND_CPU, 0), "127.0.0.1-cpu-0");
}

TEST(WorkerDaemonTest, CpuWorkerServesMetricsAndShutsDownWhileCoordinatorIsAway) {
  WorkerConfig config;
  config.coordinator = "127.0.0.1:1";  // nothing listens on port 1
  config.host = "fake-host";
  config.device_index = 1;
  config.backoff.initial = absl::Milliseconds(10);
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon = WorkerDaemon::Create(config);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_NE((*daemon)->incarnation().value(), 0u);
  EXPECT_EQ((*daemon)->agent().identity().worker_id, "fake-host-cpu-1");
  EXPECT_EQ((*daemon)->agent().identity().metrics_address, (*daemon)->metrics_address());
  EXPECT_THAT((*daemon)->metrics_address(), ::testing::StartsWith("127.0.0.1:"));
  EXPECT_NE((*daemon)->metrics_address(), "127.0.0.1:0");

  std::future<absl::Status> run = std::async(std::launch::async, [&] { return (*daemon)->Run(); });
  const std::string metrics = FetchMetrics((*daemon)->metrics_address());
  EXPECT_THAT(metrics, HasSubstr("cohort_worker_attached 0"));
  EXPECT_THAT(metrics, HasSubstr("cohort_worker_heartbeats_sent_total"));
  EXPECT_THAT(metrics, HasSubstr("cohort_worker_heartbeat_rtt_seconds_bucket"));
  EXPECT_THAT(metrics, HasSubstr("cohort_worker_reconnects_total"));
  EXPECT_THAT(metrics, HasSubstr("cohort_worker_assignment_generation 0"));
  EXPECT_THAT(metrics, HasSubstr("cohort_worker_resident_memory_bytes"));
  EXPECT_THAT(metrics, HasSubstr("cohort_worker_step 0"));
  (*daemon)->Shutdown();
  ASSERT_EQ(run.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(run.get().ok());
}

TEST(WorkerDaemonTest, TakenMetricsPortIsUnavailable) {
  WorkerConfig first;
  first.coordinator = "127.0.0.1:1";
  auto a = WorkerDaemon::Create(first);
  ASSERT_TRUE(a.ok()) << a.status();
  WorkerConfig second = first;
  second.metrics_address = (*a)->metrics_address();
  auto b = WorkerDaemon::Create(second);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
}

TEST(WorkerDaemonTest, GpuWorkerWithoutAUsableGpuDoesNotStart) {
  WorkerConfig config;
  config.coordinator = "127.0.0.1:1";
  config.device_kind = v1::DEVICE_KIND_GPU;
  auto daemon = WorkerDaemon::Create(config);
  if (daemon.ok()) GTEST_SKIP() << "a working GPU is present: " << (*daemon)->device().name;
  EXPECT_THAT(daemon.status().code(), ::testing::AnyOf(absl::StatusCode::kFailedPrecondition,
                                                       absl::StatusCode::kUnimplemented));
  EXPECT_FALSE(daemon.status().message().empty());
}

}  // namespace
}  // namespace cohort::worker
