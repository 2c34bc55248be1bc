// The worker commands (coordinator/jobs/worker_commands.h): each carries what
// proto/README.md says it carries, and a generation's shared part merged with
// a member's coordinates is that member's whole command.

#include "coordinator/jobs/worker_commands.h"

#include "coordinator/jobs/job_manager.h"
#include "gtest/gtest.h"
#include "tests/testing/job_specs.h"

namespace cohort::coordinator {
namespace {

v1::Mesh TwoMembers() {
  v1::Mesh mesh;
  mesh.set_data_parallel(2);
  mesh.set_tensor_parallel(1);
  mesh.set_pipeline_parallel(1);
  for (int r = 0; r < 2; ++r) {
    v1::MeshMember* m = mesh.add_members();
    m->set_worker_id(r == 0 ? "w0" : "w1");
    m->mutable_coordinates()->set_rank(r);
    m->mutable_coordinates()->set_data(r);
  }
  return mesh;
}

TEST(WorkerCommandsTest, ASharedReconfigurePlusCoordinatesIsTheMembersCommand) {
  const v1::Mesh mesh = TwoMembers();
  v1::RecoveryPlan plan;
  plan.set_kind(v1::RECOVERY_KIND_PEER);
  plan.set_step(12);
  const v1::JobSpec spec = testing::SmallJobSpec("j", 1, 2, 2);
  const v1::CoordinatorMessage base =
      commands::Reconfigure(JobId("j-1"), Generation(4), mesh, plan, spec, "worker w2 lost");
  const v1::CoordinatorMessage full = Effects::Message::WithBase(
      base, commands::MemberCoordinates(base.kind_case(), mesh.members(1).coordinates()));
  ASSERT_TRUE(full.has_reconfigure());
  const v1::Reconfigure& r = full.reconfigure();
  EXPECT_EQ(r.job_id(), "j-1");
  EXPECT_EQ(r.generation(), 4u);
  EXPECT_EQ(r.role(), v1::RECONFIGURE_ROLE_MEMBER);
  EXPECT_EQ(r.reason(), "worker w2 lost");
  EXPECT_EQ(r.recovery().step(), 12);
  EXPECT_EQ(r.mesh().members_size(), 2);
  EXPECT_EQ(r.coordinates().rank(), 1);
  EXPECT_EQ(r.spec().name(), "j");  // a worker that missed its Assign can join
  EXPECT_FALSE(base.reconfigure().has_coordinates());
}

TEST(WorkerCommandsTest, AssignDonorSuspendStopAndDrain) {
  const v1::Mesh mesh = TwoMembers();
  const v1::JobSpec spec = testing::SmallJobSpec("j", 1, 2, 2);
  const v1::CoordinatorMessage assign = Effects::Message::WithBase(
      commands::Assign(JobId("j-1"), Generation(1), mesh, v1::RecoveryPlan(), spec),
      commands::MemberCoordinates(v1::CoordinatorMessage::kAssign, mesh.members(0).coordinates()));
  ASSERT_TRUE(assign.has_assign());
  EXPECT_EQ(assign.assign().generation(), 1u);
  EXPECT_EQ(assign.assign().coordinates().rank(), 0);
  EXPECT_EQ(assign.assign().spec().name(), "j");

  const v1::CoordinatorMessage donor = commands::DonorReconfigure(
      JobId("j-1"), Generation(5), mesh, v1::RecoveryPlan(), "donate state to generation 5");
  EXPECT_EQ(donor.reconfigure().role(), v1::RECONFIGURE_ROLE_DONOR);
  EXPECT_FALSE(donor.reconfigure().has_spec());

  const v1::CoordinatorMessage suspend = commands::Suspend(JobId("j-1"), Generation(5), "why");
  EXPECT_EQ(suspend.suspend().job_id(), "j-1");
  EXPECT_EQ(suspend.suspend().generation(), 5u);
  EXPECT_EQ(suspend.suspend().reason(), "why");
  const v1::CoordinatorMessage stop = commands::Stop(JobId("j-1"), Generation(6), "done");
  EXPECT_EQ(stop.stop().generation(), 6u);
  EXPECT_EQ(stop.stop().reason(), "done");
  EXPECT_EQ(commands::Drain("disk").drain().reason(), "disk");
}

}  // namespace
}  // namespace cohort::coordinator
