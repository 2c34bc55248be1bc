// kill -9 the coordinator and restart it on the same data dir: jobs, their
// states and generations survive, and the workers (never restarted)
// re-attach and are re-adopted without a re-plan.
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"

namespace cohort::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);

TEST(CoordinatorRestartTest, JobsAndGenerationsSurviveAndWorkersReattach) {
  LocalCluster cluster("restart");
  cluster.StartCoordinator(/*readopt_grace=*/"20s");
  std::vector<Subprocess*> processes;
  for (int i = 0; i < 4; ++i) {
    processes.push_back(cluster.StartWorker(absl::StrCat("w", i), "host", i));
  }
  cluster.WaitForIdleWorkers(4);
  // One running job, one pending (it needs more workers than exist), one cancelled.
  auto running = cluster.Submit(LocalCluster::Spec(/*tensor=*/2, 4, 4));
  ASSERT_TRUE(running.ok()) << running.status();
  v1::Job before = cluster.WaitForJob(
      running->job_id(), [](const v1::Job& j) { return LocalCluster::RunningAndReady(j, 4); },
      kTimeout, "4 ready workers");
  auto pending = cluster.Submit(LocalCluster::Spec(/*tensor=*/2, 8, 8));
  ASSERT_TRUE(pending.ok()) << pending.status();
  auto cancelled = cluster.Submit(LocalCluster::Spec(/*tensor=*/1, 8, 8));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_job_id(cancelled->job_id());
    v1::Job reply;
    auto stub = v1::Jobs::NewStub(
        grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(stub->Cancel(&context, request, &reply).ok());
  }
  std::map<std::string, uint64_t> incarnations;
  auto workers_before = cluster.ListWorkers();
  ASSERT_TRUE(workers_before.ok());
  for (const auto& w : *workers_before) incarnations[w.worker_id()] = w.incarnation();

  cluster.coordinator()->Kill();
  ASSERT_TRUE(cluster.coordinator()->Wait(absl::Seconds(10)).ok());
  cluster.StartCoordinator(/*readopt_grace=*/"20s");

  // Jobs are listed as before.
  auto after_running = cluster.GetJob(running->job_id());
  ASSERT_TRUE(after_running.ok()) << after_running.status();
  EXPECT_EQ(after_running->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after_running->generation(), before.generation());
  EXPECT_EQ(after_running->mesh().SerializeAsString(), before.mesh().SerializeAsString());
  auto after_pending = cluster.GetJob(pending->job_id());
  ASSERT_TRUE(after_pending.ok());
  EXPECT_EQ(after_pending->state(), v1::JOB_STATE_PENDING);
  auto after_cancelled = cluster.GetJob(cancelled->job_id());
  ASSERT_TRUE(after_cancelled.ok());
  EXPECT_EQ(after_cancelled->state(), v1::JOB_STATE_CANCELLED);

  // The same worker processes re-attach (same incarnations) and are re-adopted.
  ASSERT_TRUE(WaitUntil(
      [&] { return cluster.CountWorkers(v1::WORKER_STATE_ASSIGNED) == 4; }, kTimeout))
      << "workers did not re-attach; coordinator log:\n"
      << cluster.coordinator()->ReadLog();
  auto workers_after = cluster.ListWorkers();
  ASSERT_TRUE(workers_after.ok());
  for (const auto& w : *workers_after) {
    EXPECT_EQ(w.incarnation(), incarnations[w.worker_id()]) << w.worker_id() << " was restarted";
    EXPECT_EQ(w.job_id(), running->job_id());
  }
  for (Subprocess* p : processes) EXPECT_TRUE(p->Running());
  // Re-adoption kept the generation: no re-plan happened.
  auto final_job = cluster.GetJob(running->job_id());
  ASSERT_TRUE(final_job.ok());
  EXPECT_EQ(final_job->generation(), before.generation());
  EXPECT_EQ(final_job->state(), v1::JOB_STATE_RUNNING);
}

TEST(CoordinatorRestartTest, MissingMembersAreReplannedAfterTheGracePeriod) {
  LocalCluster cluster("regrace");
  cluster.StartCoordinator(/*readopt_grace=*/"2s");
  std::vector<Subprocess*> processes;
  for (int i = 0; i < 4; ++i) {
    processes.push_back(cluster.StartWorker(absl::StrCat("w", i), "host", i));
  }
  cluster.WaitForIdleWorkers(4);
  auto submitted = cluster.Submit(LocalCluster::Spec(/*tensor=*/2, 2, 4));
  ASSERT_TRUE(submitted.ok());
  v1::Job before = cluster.WaitForJob(
      submitted->job_id(), [](const v1::Job& j) { return LocalCluster::RunningAndReady(j, 4); },
      kTimeout, "4 ready workers");
  // The coordinator and one worker die together.
  cluster.coordinator()->Kill();
  processes[3]->Kill();
  ASSERT_TRUE(cluster.coordinator()->Wait(absl::Seconds(10)).ok());
  cluster.StartCoordinator(/*readopt_grace=*/"2s");
  v1::Job after = cluster.WaitForJob(
      before.job_id(),
      [&](const v1::Job& j) {
        return j.generation() == before.generation() + 1 && LocalCluster::RunningAndReady(j, 2);
      },
      kTimeout, "a re-plan over the survivors after the grace period");
  for (const auto& m : after.mesh().members()) EXPECT_NE(m.worker_id(), "w3");
}

}  // namespace
}  // namespace cohort::testing
