// In-process tests of UcxCommunicator: two UcxContexts (ranks 0 and 1 of a
// world of two) in one process, bootstrapped through an in-memory KvClient.
// Multi-process behaviour lives in tests/integration/ucx_collectives_test.cc.

#include "worker/comm/ucx_communicator.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/wait.h"
#include "worker/comm/tracked_communicator.h"
#include "worker/comm/ucx_context.h"

namespace cohort::comm {
namespace {

class MemoryKvClient : public KvClient {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> WaitFor(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.contains(key); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError(key);
    }
    return values_[key];
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

class UcxCommunicatorTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    setenv("UCX_TLS", GetParam().c_str(), 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    absl::StatusOr<std::unique_ptr<UcxContext>> results[2];
    std::thread other([&] { results[1] = UcxContext::Create(Options(1)); });
    results[0] = UcxContext::Create(Options(0));
    other.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      contexts_[r] = std::move(*results[r]);
      auto comm = UcxCommunicator::Create(contexts_[r].get(), {.comm_id = 5});
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms_[r] = std::move(*comm);
    }
  }

  void TearDown() override {
    // Both contexts close at once, as separate processes would: a flush
    // close needs the peer's worker to make progress.
    for (auto& comm : comms_) comm.reset();
    std::thread other([&] { contexts_[1].reset(); });
    contexts_[0].reset();
    other.join();
  }

  UcxContextOptions Options(int rank) {
    UcxContextOptions options;
    options.rank = rank;
    options.size = 2;
    options.kv = &kv_;
    options.bootstrap_timeout = absl::Seconds(20);
    return options;
  }

  MemoryKvClient kv_;
  std::unique_ptr<UcxContext> contexts_[2];
  std::unique_ptr<UcxCommunicator> comms_[2];
};

TEST_P(UcxCommunicatorTest, AllReduceAcrossTwoContexts) {
  std::vector<float> data[2];
  for (int r = 0; r < 2; ++r) data[r] = std::vector<float>(300001, static_cast<float>(r + 1));
  absl::Status status[2];
  std::thread other([&] {
    status[1] = comms_[1]->AllReduce(data[1].data(), data[1].size(), DataType::kFloat32,
                                     ReduceOp::kSum, absl::Seconds(20));
  });
  status[0] = comms_[0]->AllReduce(data[0].data(), data[0].size(), DataType::kFloat32,
                                   ReduceOp::kSum, absl::Seconds(20));
  other.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(data[r].front(), 3.0f);
    EXPECT_EQ(data[r].back(), 3.0f);
    EXPECT_EQ(data[r], data[0]);
  }
}

TEST_P(UcxCommunicatorTest, AbortFromAnotherThreadUnblocksRecvAtOnce) {
  uint64_t buffer = 0;
  absl::Time aborted_at;
  // The abort comes once Recv is in flight (the counter a trainer reports
  // waiting by), so it finds Recv waiting rather than refusing a later call.
  std::atomic<int> in_flight{0};
  TrackedCommunicator tracked(comms_[1].get(), &in_flight);
  std::thread aborter([&] {
    EXPECT_TRUE(testing::WaitUntil([&] { return in_flight.load() == 1; }, absl::Seconds(30),
                                   absl::Microseconds(100)));
    aborted_at = absl::Now();
    comms_[1]->Abort(absl::CancelledError("test abort"));
  });
  const absl::Time start = absl::Now();
  absl::Status status = tracked.Recv(&buffer, 8, 0, 3, absl::Seconds(30));
  const absl::Time returned = absl::Now();
  aborter.join();
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_NE(status.message().find("test abort"), std::string::npos) << status;
  const absl::Duration latency = returned - aborted_at;
  std::printf("Recv returned %.2f ms after Abort (%.1f ms after start)\n",
              absl::ToDoubleMilliseconds(latency), absl::ToDoubleMilliseconds(returned - start));
  EXPECT_LT(latency, absl::Milliseconds(50));
  // Every later call fails the same way, without waiting.
  float x = 1;
  EXPECT_TRUE(absl::IsAborted(
      comms_[1]->AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum, absl::Seconds(30))));
  EXPECT_TRUE(absl::IsAborted(comms_[1]->Barrier(absl::Seconds(30))));
  // The other rank's communicator is unaffected.
  EXPECT_EQ(comms_[0]->rank(), 0);
}

TEST_P(UcxCommunicatorTest, HungPeerIsDeadlineExceededAndBreaksTheCommunicator) {
  uint64_t buffer = 0;
  const absl::Time start = absl::Now();
  absl::Status status = comms_[0]->Recv(&buffer, 8, 1, 4, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_TRUE(absl::IsDeadlineExceeded(comms_[0]->Barrier(absl::Seconds(30))));
}

TEST_P(UcxCommunicatorTest, ArgumentChecks) {
  float x = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(
      comms_[0]->AllReduce(nullptr, 4, DataType::kFloat32, ReduceOp::kSum, absl::Seconds(1))));
  EXPECT_TRUE(absl::IsInvalidArgument(comms_[0]->Send(&x, 4, 0, 1, absl::Seconds(1))));
  EXPECT_TRUE(absl::IsInvalidArgument(comms_[0]->Recv(&x, 4, 2, 1, absl::Seconds(1))));
  EXPECT_TRUE(
      absl::IsInvalidArgument(comms_[0]->Broadcast(&x, 1, DataType::kFloat32, 2, absl::Seconds(1))));
  // Argument errors do not break the communicator: count 0 is a no-op.
  EXPECT_TRUE(comms_[0]->AllReduce(&x, 0, DataType::kFloat32, ReduceOp::kSum, absl::Seconds(1)).ok());
  // Ids are unique per context; groups must contain this rank.
  EXPECT_TRUE(absl::IsAlreadyExists(
      UcxCommunicator::Create(contexts_[0].get(), {.comm_id = 5}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      UcxCommunicator::Create(contexts_[0].get(), {.comm_id = 6, .group = {1}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      UcxCommunicator::Create(contexts_[0].get(), {.comm_id = 6, .group = {0, 0}}).status()));
  auto single = UcxCommunicator::Create(contexts_[0].get(), {.comm_id = 6, .group = {0}});
  ASSERT_TRUE(single.ok()) << single.status();
  float y = 2;
  EXPECT_TRUE((*single)->AllReduce(&y, 1, DataType::kFloat32, ReduceOp::kSum, absl::Seconds(1)).ok());
  EXPECT_EQ(y, 2.0f);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxCommunicatorTest, ::testing::Values("tcp", "sm,self"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "tcp" ? std::string("tcp") : std::string("sm");
                         });

}  // namespace
}  // namespace cohort::comm
