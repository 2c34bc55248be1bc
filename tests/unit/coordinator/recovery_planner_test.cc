#include "coordinator/jobs/recovery_planner.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

// A dp x tp x pp mesh of workers "<prefix><rank>" in Megatron order.
v1::Mesh MakeMesh(int dp, int tp, int pp, const std::string& prefix = "w") {
  v1::Mesh mesh;
  mesh.set_data_parallel(dp);
  mesh.set_tensor_parallel(tp);
  mesh.set_pipeline_parallel(pp);
  for (int r = 0; r < dp * tp * pp; ++r) {
    v1::MeshMember* m = mesh.add_members();
    m->set_worker_id(absl::StrCat(prefix, r));
    m->set_incarnation(100 + r);
    m->mutable_coordinates()->set_rank(r);
    m->mutable_coordinates()->set_tensor(r % tp);
    m->mutable_coordinates()->set_data((r / tp) % dp);
    m->mutable_coordinates()->set_pipeline(r / (dp * tp));
  }
  return mesh;
}

RecoveryInput Input(const v1::Mesh& source, bool zero1, int replicas) {
  RecoveryInput input;
  input.source = StateSource{Generation(3), source, zero1, replicas};
  for (const v1::MeshMember& m : source.members()) input.holders[m.worker_id()] = 40;
  return input;
}

TEST(RecoveryPlannerTest, ASpareTakesALostDataRanksPlaceFromItsReplicasAndMirror) {
  const v1::Mesh source = MakeMesh(4, 1, 1);
  RecoveryInput input = Input(source, /*zero1=*/true, /*replicas=*/2);
  input.holders.erase("w2");
  input.holders["w1"] = 41;  // finished the step the others were in: still holds 40
  input.next_mesh = source;
  input.next_mesh.mutable_members(2)->set_worker_id("spare");
  const v1::RecoveryPlan plan = PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  EXPECT_EQ(plan.step(), 40);
  EXPECT_EQ(plan.lost_steps(), 1);  // w1 completed step 41, which is trained again
  EXPECT_EQ(plan.source_generation(), 3u);
  ASSERT_EQ(plan.pieces_size(), 4);
  // Owners serve their own pieces; w2's weights come from the next replica
  // (w3) and its moments from its mirror on w3.
  EXPECT_EQ(plan.pieces(0).params_from(), 0);
  EXPECT_EQ(plan.pieces(2).params_from(), 3);
  EXPECT_EQ(plan.pieces(2).optimizer_from(), 3);
  EXPECT_EQ(plan.pieces(2).optimizer_holder_rank(), 3);
  EXPECT_TRUE(plan.donors().empty());
  EXPECT_TRUE(IsSpareReplacement(plan, source, input.next_mesh));
  // Which source rank each participant holds: the spare none.
  EXPECT_THAT(plan.participant_source_ranks(), ::testing::ElementsAre(0, 1, -1, 3));
}

TEST(RecoveryPlannerTest, LostStepsCountWhatAnyRankCompletedBeyondTheResumeStep) {
  const v1::Mesh source = MakeMesh(2, 1, 1);
  RecoveryInput input = Input(source, /*zero1=*/false, /*replicas=*/1);
  input.next_mesh = source;
  EXPECT_EQ(PlanRecovery(input).lost_steps(), 0);  // everyone at 40
  // Rank 0 reported step 42 before it stopped; the survivors hold 40.
  input.reported_step = 42;
  v1::RecoveryPlan plan = PlanRecovery(input);
  EXPECT_EQ(plan.step(), 40);
  EXPECT_EQ(plan.lost_steps(), 2);
  // Without any holder: a fresh start loses what was reported or held.
  input.holders.clear();
  plan = PlanRecovery(input);
  EXPECT_EQ(plan.kind(), v1::RECOVERY_KIND_NONE);
  EXPECT_EQ(plan.lost_steps(), 42);
}

TEST(RecoveryPlannerTest, ShrinkingKeepsLeavingHoldersAsDonors) {
  const v1::Mesh source = MakeMesh(4, 1, 1);
  RecoveryInput input = Input(source, /*zero1=*/true, /*replicas=*/2);
  input.holders.erase("w0");  // lost
  input.next_mesh = MakeMesh(2, 1, 1, "x");
  input.next_mesh.mutable_members(0)->set_worker_id("w1");
  input.next_mesh.mutable_members(1)->set_worker_id("w2");
  const v1::RecoveryPlan plan = PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  // w3 is outside the new mesh but alone holds piece 3's moments (its
  // mirror, w0, is lost): it is donor 0, participant 2. The weights of
  // piece 3 come from a member instead (w1, participant 0).
  ASSERT_EQ(plan.donors_size(), 1);
  EXPECT_EQ(plan.donors(0).worker_id(), "w3");
  EXPECT_EQ(plan.donors(0).source_coordinates().rank(), 3);
  EXPECT_EQ(plan.pieces(3).optimizer_from(), 2);
  EXPECT_EQ(plan.pieces(3).params_from(), 0);
  // w0's moments live on its mirror w1 (participant 0).
  EXPECT_EQ(plan.pieces(0).optimizer_from(), 0);
  EXPECT_EQ(plan.pieces(0).optimizer_holder_rank(), 1);
  EXPECT_FALSE(IsSpareReplacement(plan, source, input.next_mesh));
}

TEST(RecoveryPlannerTest, LosingEveryCopyOfAShardFallsBackToTheCheckpoint) {
  const v1::Mesh source = MakeMesh(4, 1, 1);
  RecoveryInput input = Input(source, /*zero1=*/true, /*replicas=*/2);
  input.holders.erase("w1");
  input.holders.erase("w2");  // w1's owner and its only mirror
  input.next_mesh = MakeMesh(2, 1, 1);
  input.checkpoint_step = 30;
  input.reported_step = 41;
  const v1::RecoveryPlan plan = PlanRecovery(input);
  EXPECT_EQ(plan.kind(), v1::RECOVERY_KIND_CHECKPOINT);
  EXPECT_EQ(plan.step(), 30);
  EXPECT_EQ(plan.lost_steps(), 11);
  EXPECT_THAT(plan.reason(), ::testing::HasSubstr("optimizer state of source rank 1"));

  input.checkpoint_step.reset();
  const v1::RecoveryPlan none = PlanRecovery(input);
  EXPECT_EQ(none.kind(), v1::RECOVERY_KIND_NONE);
  EXPECT_EQ(none.step(), 0);
  EXPECT_EQ(none.lost_steps(), 41);
}

TEST(RecoveryPlannerTest, WithoutZeroOneEveryReplicaHoldsTheMoments) {
  const v1::Mesh source = MakeMesh(4, 1, 1);
  RecoveryInput input = Input(source, /*zero1=*/false, /*replicas=*/1);
  input.holders.erase("w1");
  input.holders.erase("w2");
  input.next_mesh = MakeMesh(2, 1, 1, "n");
  const v1::RecoveryPlan plan = PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  // w1's piece from w3 (the next surviving replica after it).
  EXPECT_EQ(plan.pieces(1).optimizer_holder_rank(), 3);
  EXPECT_EQ(plan.pieces(2).params_from(), plan.pieces(1).params_from());
}

TEST(RecoveryPlannerTest, TensorAndPipelineGroupsNeedASurvivorPerShard) {
  const v1::Mesh source = MakeMesh(2, 2, 2);  // 8 ranks
  RecoveryInput input = Input(source, /*zero1=*/false, /*replicas=*/1);
  input.holders.erase("w5");  // stage 1, data 0, tensor 1
  input.next_mesh = MakeMesh(1, 2, 2, "n");
  ASSERT_EQ(PlanRecovery(input).kind(), v1::RECOVERY_KIND_PEER);
  input.holders.erase("w7");  // its replica (stage 1, data 1, tensor 1): the shard is gone
  EXPECT_EQ(PlanRecovery(input).kind(), v1::RECOVERY_KIND_NONE);
}

TEST(RecoveryPlannerTest, HoldersTooFarAheadAreNotSourcesAndNoStateMeansAFreshStart) {
  const v1::Mesh source = MakeMesh(2, 1, 2);
  RecoveryInput input = Input(source, /*zero1=*/false, 1);
  // Stage 1's ranks hold only step 10; w1 (stage 0) is two steps ahead of
  // w0, which the protocol never produces: it holds 12 and 11, not 10, and
  // stage 1 has nothing at 11, so the plan resumes at 10 without w1.
  input.holders["w0"] = 10;
  input.holders["w1"] = 12;
  input.holders["w2"] = 10;
  input.holders["w3"] = 10;
  input.next_mesh = source;
  const v1::RecoveryPlan plan = PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  EXPECT_EQ(plan.step(), 10);
  EXPECT_EQ(plan.pieces(1).params_from(), 0);

  RecoveryInput empty;
  empty.next_mesh = source;
  EXPECT_EQ(PlanRecovery(empty).kind(), v1::RECOVERY_KIND_NONE);
}

// Issue 22: a whole-job stall (tests/integration/elastic_stall_test.cc) can
// stop the job while a step's all-reduce has ended on some ranks only. Those
// ranks hold the step; when they hold every piece of it, nothing is lost.
TEST(RecoveryPlannerTest, RanksThatCompletedTheStepServeItWhenTheyHoldEveryPiece) {
  const v1::Mesh source = MakeMesh(4, 1, 1);
  RecoveryInput input = Input(source, /*zero1=*/false, /*replicas=*/1);
  input.holders["w1"] = 41;  // the others stopped in step 41's all-reduce
  input.next_mesh = source;
  v1::RecoveryPlan plan = PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  EXPECT_EQ(plan.step(), 41);
  EXPECT_EQ(plan.lost_steps(), 0);
  for (const v1::PieceSource& piece : plan.pieces()) {
    EXPECT_EQ(piece.params_from(), 1);  // only w1 holds step 41
    EXPECT_EQ(piece.optimizer_from(), 1);
  }

  // With ZeRO-1, w1 holds only its own moments of step 41: resume at 40 and
  // train 41 again.
  input.source->zero1 = true;
  plan = PlanRecovery(input);
  ASSERT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
  EXPECT_EQ(plan.step(), 40);
  EXPECT_EQ(plan.lost_steps(), 1);

  // Two copies of each moment shard (shard d on ranks d and d + 1): w1
  // alone misses shards 2 and 3, but w1 and w3 together hold every shard.
  input.source->optimizer_replicas = 2;
  EXPECT_EQ(PlanRecovery(input).step(), 40);
  input.holders["w3"] = 41;
  plan = PlanRecovery(input);
  EXPECT_EQ(plan.step(), 41);
  EXPECT_EQ(plan.lost_steps(), 0);
  EXPECT_EQ(plan.pieces(0).optimizer_holder_rank(), 1);
  EXPECT_EQ(plan.pieces(2).optimizer_holder_rank(), 3);
}

}  // namespace
}  // namespace cohort::coordinator
