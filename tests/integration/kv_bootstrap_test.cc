// The communicator bootstrap path against the real coordinator: clients made
// by NewCoordinatorKvClient exchange values within the job's current
// generation; other generations are refused; when a worker is killed and
// replaced, waiters of the old generation are aborted and the new generation
// starts from an empty scope (two generations in a row rebuild from the
// KeyValue service).
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "worker/comm/kv_client.h"

namespace cohort::testing {
namespace {

using ::cohort::comm::KvClient;
using ::cohort::comm::NewCoordinatorKvClient;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// Rank 0 and rank 1 publish an "address" each and read the other's, the way
// a communicator bootstraps.
void ExchangeAddresses(KvClient& rank0, KvClient& rank1, const std::string& tag) {
  ASSERT_TRUE(rank0.Set("addr/0", "rank0-" + tag).ok());
  ASSERT_TRUE(rank1.Set("addr/1", "rank1-" + tag).ok());
  absl::StatusOr<std::string> seen_by_0 = rank0.WaitFor("addr/1", absl::Seconds(10));
  absl::StatusOr<std::string> seen_by_1 = rank1.WaitFor("addr/0", absl::Seconds(10));
  ASSERT_TRUE(seen_by_0.ok()) << seen_by_0.status();
  ASSERT_TRUE(seen_by_1.ok()) << seen_by_1.status();
  EXPECT_EQ(*seen_by_0, "rank1-" + tag);
  EXPECT_EQ(*seen_by_1, "rank0-" + tag);
}

TEST(KvBootstrapIntegrationTest, ScopedToTheCurrentGenerationAcrossAReplacement) {
  LocalCluster cluster("kv");
  cluster.StartCoordinator();
  Subprocess* w0 = cluster.StartWorker("w0", "host", 0);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(cluster.StartWorker("w1", "host", 1), nullptr);
  cluster.WaitForIdleWorkers(2);
  auto submitted = cluster.Submit(LocalCluster::Spec(/*tensor=*/1, 2, 2));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job_id = submitted->job_id();
  v1::Job job = cluster.WaitForJob(
      job_id, [](const v1::Job& j) { return LocalCluster::RunningAndReady(j, 2); }, kTimeout,
      "2 ready workers");
  ASSERT_TRUE(LocalCluster::RunningAndReady(job, 2));
  const uint64_t g = job.generation();
  ASSERT_GE(g, 1u);

  // Within generation g: a value set by one client is read by another, and
  // a waiter is released by a later Set.
  auto a = NewCoordinatorKvClient(CoordinatorTarget::Insecure(cluster.address()), {job_id, g});
  auto b = NewCoordinatorKvClient(CoordinatorTarget::Insecure(cluster.address()), {job_id, g});
  ASSERT_TRUE(a->Set("k", "v1").ok());
  absl::StatusOr<std::string> value = b->WaitFor("k", absl::Seconds(10));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v1");
  ExchangeAddresses(*a, *b, "g");
  EXPECT_EQ(b->WaitFor("missing", absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);

  // A generation that does not exist yet is refused, not waited on.
  auto future = NewCoordinatorKvClient(CoordinatorTarget::Insecure(cluster.address()), {job_id, g + 1});
  EXPECT_EQ(future->Set("k", "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(future->WaitFor("k", absl::Seconds(5)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto unknown_job = NewCoordinatorKvClient(CoordinatorTarget::Insecure(cluster.address()), {"no-such-job", 1});
  EXPECT_EQ(unknown_job->Set("k", "x").code(), absl::StatusCode::kNotFound);

  // A waiter parked on generation g while the mesh changes under it.
  std::optional<absl::StatusOr<std::string>> pending;
  std::jthread waiter([&] { pending = b->WaitFor("never-set", absl::Seconds(60)); });

  // kill -9 one member and start a replacement: the job moves to g' > g.
  w0->Kill();
  ASSERT_NE(cluster.StartWorker("w2", "host", 2), nullptr);
  v1::Job next = cluster.WaitForJob(
      job_id,
      [g](const v1::Job& j) { return j.generation() > g && LocalCluster::RunningAndReady(j, 2); },
      kTimeout, "a later generation with 2 ready workers");
  waiter.join();
  ASSERT_TRUE(pending.has_value());
  EXPECT_EQ(pending->status().code(), absl::StatusCode::kAborted) << pending->status();
  const uint64_t g2 = next.generation();
  ASSERT_GT(g2, g);
  bool has_w2 = false;
  for (const auto& m : next.mesh().members()) has_w2 |= m.worker_id() == "w2";
  EXPECT_TRUE(has_w2) << next.DebugString();

  // Generation g is stale now: every call on it is Aborted, without retries
  // stretching it out.
  const absl::Time start = absl::Now();
  EXPECT_EQ(a->Set("k", "late").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->WaitFor("k", absl::Seconds(10)).status().code(), absl::StatusCode::kAborted);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Generation g' starts empty and bootstraps afresh.
  auto a2 = NewCoordinatorKvClient(CoordinatorTarget::Insecure(cluster.address()), {job_id, g2});
  auto b2 = NewCoordinatorKvClient(CoordinatorTarget::Insecure(cluster.address()), {job_id, g2});
  EXPECT_EQ(b2->WaitFor("k", absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ExchangeAddresses(*a2, *b2, "g2");
  std::optional<absl::StatusOr<std::string>> released;
  std::jthread late_reader([&] { released = b2->WaitFor("late", absl::Seconds(20)); });
  ASSERT_TRUE(a2->Set("late", "v2").ok());
  late_reader.join();
  ASSERT_TRUE(released->ok()) << released->status();
  EXPECT_EQ(**released, "v2");
}

}  // namespace
}  // namespace cohort::testing
