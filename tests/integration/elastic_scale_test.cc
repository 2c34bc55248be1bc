// Elastic membership changes with real processes on loopback: scaling a job
// up and down while it trains, draining a worker, killing the coordinator,
// and a worker that hangs (SIGSTOP) and comes back (SIGCONT). Trajectories
// are compared with a fault-free run as in elastic_test.cc.

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;

// The newest step any worker has logged for `job_id`.
int NewestLoggedStep(const std::map<int, std::string>& losses) {
  return losses.empty() ? 0 : losses.rbegin()->first;
}

// 2 -> 4 -> 2 workers with ZeRO-1: the joiners get their state from peers,
// the leavers hand their optimizer shards over before they go.
TEST_F(ElasticTest, ScalingTwoToFourToTwoKeepsTheTrajectory) {
  StartCluster(4);
  const v1::JobSpec spec = ElasticSpec("scale", 1, 1, 2, 2, /*zero1=*/true, /*steps=*/50);
  const std::map<int, std::string> reference = Reference(spec);
  const std::string id = SubmitJob(spec);
  ASSERT_FALSE(Finished(WaitForStep(id, 10, 2)));
  ASSERT_TRUE(cluster_.Scale(id, 4, 4).ok());
  const v1::Job grown = WaitForStep(id, 25, 4);
  ASSERT_FALSE(Finished(grown)) << "the job finished before scaling down";
  EXPECT_EQ(grown.generation(), 2u);
  EXPECT_EQ(grown.recovery().kind(), v1::RECOVERY_KIND_PEER) << grown.recovery().reason();
  ASSERT_TRUE(cluster_.Scale(id, 2, 2).ok());
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.generation(), 3u) << Logs();
  EXPECT_EQ(job.mesh().members_size(), 2);
  EXPECT_EQ(job.recovery().kind(), v1::RECOVERY_KIND_PEER) << job.recovery().reason();
  // Data rank 2's moments live only on ranks 2 and 3 (its mirror), both
  // left out: one of them serves them as a donor.
  EXPECT_GE(job.recovery().donors_size(), 1) << job.recovery().DebugString();
  EXPECT_EQ(job.recovery_stats().peer(), 2);
  // A kill can land between one survivor's update of step t+1 and another's:
  // t+1 is trained again and counted (at most that one step; the killed
  // rank may have logged it unheard, so the count is at most what was redone).
  EXPECT_LE(job.recovery_stats().lost_steps(), 1);
  EXPECT_LE(job.recovery_stats().lost_steps(), RedoneSteps(id)) << Logs();  // never more than redone
  EXPECT_EQ(cluster_.CountWorkers(v1::WORKER_STATE_IDLE), 4);
  ExpectTrajectory("dp 2 -> 4 -> 2, ZeRO-1", Losses(id), reference, /*bitwise=*/true);
}

// A drained member hands its place to the spare (same layout: bitwise) and
// exits.
TEST_F(ElasticTest, DrainedMemberHandsOverToTheSpareAndExits) {
  StartCluster(3);
  const v1::JobSpec spec = ElasticSpec("drain", 1, 1, 2, 2, /*zero1=*/true);
  const std::map<int, std::string> reference = Reference(spec);
  const std::string id = SubmitJob(spec);
  const v1::Job before = WaitForStep(id, 10, 2);
  ASSERT_FALSE(Finished(before));
  const std::string drained = before.mesh().members(1).worker_id();
  absl::StatusOr<v1::WorkerInfo> info = cluster_.Drain(drained, "maintenance");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), v1::WORKER_STATE_DRAINING);
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.generation(), 2u);
  for (const auto& member : job.mesh().members()) EXPECT_NE(member.worker_id(), drained);
  EXPECT_EQ(job.recovery_stats().spare(), 1);
  absl::StatusOr<int> exit_code = Member(before, 1)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit_code.ok()) << "the drained worker did not exit\n" << Logs();
  EXPECT_EQ(*exit_code, 0);
  ExpectTrajectory("dp 2, rank 1 drained, spare takes over", Losses(id), reference,
                   /*bitwise=*/true);
}

// Training does not need the coordinator: with it killed the workers keep
// stepping; the restarted coordinator re-adopts them without a re-plan.
TEST_F(ElasticTest, KilledCoordinatorDoesNotStopTrainingOrCostAStep) {
  StartCluster(2);
  const v1::JobSpec spec = ElasticSpec("coord", 1, 1, 2, 2, /*zero1=*/false, /*steps=*/60);
  const std::map<int, std::string> reference = Reference(spec);
  const std::string id = SubmitJob(spec);
  ASSERT_FALSE(Finished(WaitForStep(id, 10, 2)));
  cluster_.coordinator()->Kill();
  ASSERT_TRUE(cluster_.coordinator()->Wait(absl::Seconds(10)).ok());
  const int at_kill = NewestLoggedStep(Losses(id));
  EXPECT_TRUE(WaitUntil([&] { return NewestLoggedStep(Losses(id)) >= at_kill + 10; },
                        absl::Seconds(60)))
      << "training stopped with the coordinator at step " << NewestLoggedStep(Losses(id)) << "\n"
      << Logs();
  std::printf("steps %d -> %d trained while the coordinator was down\n", at_kill,
              NewestLoggedStep(Losses(id)));
  cluster_.StartCoordinator();
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.generation(), 1u) << Logs();
  EXPECT_EQ(job.recovery_stats().peer() + job.recovery_stats().checkpoint(), 0);
  ExpectTrajectory("dp 2, coordinator killed at step 10", Losses(id), reference,
                   /*bitwise=*/true);
}

// A stopped process stops heartbeating: it is declared lost, the spare
// takes its place; once continued it finds itself fenced (its old
// generation's messages are refused) and re-attaches as an idle worker.
TEST_F(ElasticTest, HungWorkerIsFencedAndRejoinsAsANewMember) {
  StartCluster(3);
  const v1::JobSpec spec = ElasticSpec("hang", 1, 1, 2, 2, /*zero1=*/true);
  const std::map<int, std::string> reference = Reference(spec);
  const std::string id = SubmitJob(spec);
  const v1::Job before = WaitForStep(id, 10, 2);
  ASSERT_FALSE(Finished(before));
  const std::string hung = before.mesh().members(1).worker_id();
  Subprocess* process = Member(before, 1);
  process->Signal(SIGSTOP);
  const v1::Job recovered = cluster_.WaitForJob(
      id, [](const v1::Job& j) { return j.generation() >= 2 || Finished(j); }, absl::Seconds(30),
      "a re-plan without the stopped worker");
  for (const auto& member : recovered.mesh().members()) EXPECT_NE(member.worker_id(), hung);
  process->Signal(SIGCONT);
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.generation(), 2u) << Logs();
  EXPECT_EQ(job.recovery_stats().spare(), 1);
  ExpectTrajectory("dp 2, rank 1 stopped, spare takes over", Losses(id), reference,
                   /*bitwise=*/true);
  // Back from SIGCONT: refused, re-attached, idle and usable.
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto workers = cluster_.ListWorkers();
        if (!workers.ok()) return false;
        for (const auto& w : *workers) {
          if (w.worker_id() == hung) return w.state() == v1::WORKER_STATE_IDLE;
        }
        return false;
      },
      absl::Seconds(60)))
      << Logs();
  const std::string coordinator_log = cluster_.coordinator()->ReadLog();
  EXPECT_THAT(coordinator_log, HasSubstr(absl::StrCat("worker ", hung, " lost (heartbeat_timeout")));
  std::printf("stopped worker %s: fenced, then re-attached idle\n", hung.c_str());
}

}  // namespace
}  // namespace cohort::testing
