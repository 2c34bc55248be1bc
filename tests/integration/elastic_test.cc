// Elastic training with real processes on loopback: workers are killed with
// SIGKILL mid-step, stopped with SIGSTOP, added and removed while a job
// trains, and the coordinator itself is killed. Each test compares the
// job's loss trajectory with a fault-free run of the same spec:
//
//   * same layout (a spare takes the lost rank's place): bitwise equal;
//   * another data-parallel degree (the job shrinks or grows; tensor and
//     pipeline degrees stay): bitwise equal too, by the deterministic
//     reduction (docs/architecture.md);
//   * recovery from a checkpoint: the steps after it bitwise equal, and the
//     lost steps reported are the steps since it.
//
// Every step that is trained twice (once before a failure, again after a
// recovery to an earlier step) must reproduce its loss exactly: ReadLosses
// checks that on every line of every worker's loss log.

#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;

class SpareTest : public ElasticTest, public ::testing::WithParamInterface<bool> {};

TEST_P(SpareTest, KilledDataRankIsReplacedByTheSpareBitwise) {
  const bool zero1 = GetParam();
  StartCluster(5);
  const v1::JobSpec spec = ElasticSpec(zero1 ? "spare-z" : "spare", 1, 1, 4, 4, zero1);
  const std::map<int, std::string> reference = Reference(spec);

  const std::string id = SubmitJob(spec);
  const v1::Job before = WaitForStep(id, 12, 4);
  ASSERT_FALSE(Finished(before)) << "the job finished before the kill";
  Member(before, 2)->Kill();
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.generation(), 2u) << Logs();
  EXPECT_EQ(job.recovery().kind(), v1::RECOVERY_KIND_PEER) << job.recovery().reason();
  EXPECT_EQ(job.recovery_stats().peer(), 1);
  EXPECT_EQ(job.recovery_stats().spare(), 1);
  // A kill can land between one survivor's update of step t+1 and another's:
  // t+1 is trained again and counted (at most that one step; the killed
  // rank may have logged it unheard, so the count is at most what was redone).
  EXPECT_LE(job.recovery_stats().lost_steps(), 1);
  EXPECT_LE(job.recovery_stats().lost_steps(), RedoneSteps(id)) << Logs();  // never more than redone
  ExpectTrajectory(absl::StrCat("dp 4, spare replaces rank 2", zero1 ? ", ZeRO-1" : ""),
                   Losses(id), reference, /*bitwise=*/true);
  std::printf("killed at step %lld; recovered at step %lld; detection to running %.3f s\n",
              static_cast<long long>(before.progress().step()),
              static_cast<long long>(job.recovery().step()),
              job.recovery_stats().last_detect_to_running_seconds());
}

INSTANTIATE_TEST_SUITE_P(Zero1, SpareTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Zero1" : "Replicated"; });

// dp 4 -> 3 on the 3 survivors, which share the 4 micro-batches 2 + 1 + 1
// (the deterministic reduction lets shares differ): no healthy survivor is
// left idle, and the trajectory stays bitwise.
TEST_F(ElasticTest, KilledDataRankWithoutASpareShrinksTheMeshFromPeers) {
  StartCluster(4);
  const v1::JobSpec spec = ElasticSpec("shrink", 1, 1, 2, 4, /*zero1=*/true);
  const std::map<int, std::string> reference = Reference(spec);
  const std::string id = SubmitJob(spec);
  const v1::Job before = WaitForStep(id, 12, 4);
  ASSERT_FALSE(Finished(before));
  Member(before, 1)->Kill();
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.generation(), 2u) << Logs();
  EXPECT_EQ(job.mesh().data_parallel(), 3);
  EXPECT_EQ(std::vector<int>(job.mesh().micro_batches().begin(), job.mesh().micro_batches().end()),
            (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(job.recovery().kind(), v1::RECOVERY_KIND_PEER) << job.recovery().reason();
  // Every survivor is a member: nobody serves from outside the mesh.
  EXPECT_EQ(job.recovery().donors_size(), 0) << job.recovery().DebugString();
  // A kill can land between one survivor's update of step t+1 and another's:
  // t+1 is trained again and counted (at most that one step; the killed
  // rank may have logged it unheard, so the count is at most what was redone).
  EXPECT_LE(job.recovery_stats().lost_steps(), 1);
  EXPECT_LE(job.recovery_stats().lost_steps(), RedoneSteps(id)) << Logs();  // never more than redone
  ExpectTrajectory("dp 4 -> 3 (2 + 1 + 1) without a spare, ZeRO-1", Losses(id), reference,
                   /*bitwise=*/true);
}

struct GroupCase {
  std::string name;
  int tensor, pipeline;
  bool zero1;
};

class GroupMemberTest : public ElasticTest, public ::testing::WithParamInterface<GroupCase> {};

// A lost member of a tensor group or a pipeline stage: the other data
// replica holds the same shard, so the survivors shrink to dp 1 from peers.
TEST_P(GroupMemberTest, KilledMemberOfAGroupShrinksToTheOtherReplica) {
  const GroupCase& c = GetParam();
  StartCluster(4);
  const v1::JobSpec spec = ElasticSpec(c.name, c.tensor, c.pipeline, 2, 4, c.zero1);
  const std::map<int, std::string> reference = Reference(spec);
  const std::string id = SubmitJob(spec);
  const v1::Job before = WaitForStep(id, 12, 4);
  ASSERT_FALSE(Finished(before));
  Member(before, 3)->Kill();
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.generation(), 2u) << Logs();
  EXPECT_EQ(job.mesh().members_size(), 2);
  EXPECT_EQ(job.recovery().kind(), v1::RECOVERY_KIND_PEER) << job.recovery().reason();
  // A kill can land between one survivor's update of step t+1 and another's:
  // t+1 is trained again and counted (at most that one step; the killed
  // rank may have logged it unheard, so the count is at most what was redone).
  EXPECT_LE(job.recovery_stats().lost_steps(), 1);
  EXPECT_LE(job.recovery_stats().lost_steps(), RedoneSteps(id)) << Logs();  // never more than redone
  ExpectTrajectory(absl::StrCat("dp 2 x tp ", c.tensor, " x pp ", c.pipeline, " -> dp 1, rank 3 "
                                "killed", c.zero1 ? ", ZeRO-1" : ""),
                   Losses(id), reference, /*bitwise=*/true);
}

INSTANTIATE_TEST_SUITE_P(Groups, GroupMemberTest,
                         ::testing::Values(GroupCase{"tensor", 2, 1, true},
                                           GroupCase{"pipeline", 1, 2, false}),
                         [](const auto& info) { return info.param.name; });

// Both replicas of tensor rank 1 die together: nobody holds that shard, so
// the job resumes from its newest checkpoint (every 10 steps), loses the
// steps since, and then follows the reference again.
TEST_F(ElasticTest, KillingEveryReplicaOfAShardRecoversFromTheCheckpoint) {
  StartCluster(4);
  v1::JobSpec spec = ElasticSpec("replicas", 2, 1, 2, 4, /*zero1=*/true);
  spec.mutable_checkpoint()->set_interval_steps(10);
  const std::map<int, std::string> reference = Reference(spec);
  const std::string id = SubmitJob(spec);
  const v1::Job before = WaitForStep(id, 14, 4);
  ASSERT_FALSE(Finished(before));
  Member(before, 1)->Kill();
  Member(before, 3)->Kill();
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.recovery().kind(), v1::RECOVERY_KIND_CHECKPOINT) << job.recovery().reason();
  EXPECT_THAT(job.recovery().reason(), HasSubstr("tensor 1"));
  const int64_t checkpoint = job.recovery().checkpoint_step();
  EXPECT_EQ(checkpoint % 10, 0);
  EXPECT_GE(checkpoint, 10);
  // Lost: the steps the survivors had reached beyond the checkpoint.
  EXPECT_GE(job.recovery_stats().lost_steps(), before.progress().step() - checkpoint);
  EXPECT_EQ(job.recovery_stats().checkpoint(), 1);
  ExpectTrajectory("dp 2 x tp 2, both tensor-rank-1 replicas killed -> checkpoint",
                   Losses(id), reference, /*bitwise=*/true);
  std::printf("checkpoint of step %lld; %lld steps lost\n", static_cast<long long>(checkpoint),
              static_cast<long long>(job.recovery_stats().lost_steps()));
}

}  // namespace
}  // namespace cohort::testing
