#include "worker/agent/worker_protocol.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/failed_peer.h"

namespace cohort::worker {
namespace {

using Kind = CommandDecision::Kind;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Mesh MeshOf(const std::vector<std::string>& workers) {
  v1::Mesh mesh;
  mesh.set_data_parallel(static_cast<int32_t>(workers.size()));
  mesh.set_tensor_parallel(1);
  mesh.set_pipeline_parallel(1);
  for (size_t i = 0; i < workers.size(); ++i) {
    v1::MeshMember* member = mesh.add_members();
    member->set_worker_id(workers[i]);
    member->mutable_coordinates()->set_rank(static_cast<int32_t>(i));
    member->mutable_coordinates()->set_data(static_cast<int32_t>(i));
  }
  return mesh;
}

v1::CoordinatorMessage AssignOf(const std::string& job, uint64_t generation, int rank = 0) {
  v1::CoordinatorMessage message;
  v1::Assign* assign = message.mutable_assign();
  assign->set_job_id(job);
  assign->set_generation(generation);
  assign->mutable_spec()->set_name(job);
  *assign->mutable_mesh() = MeshOf({"w0", "w1"});
  assign->mutable_coordinates()->set_rank(rank);
  return message;
}

v1::CoordinatorMessage ReconfigureOf(const std::string& job, uint64_t generation) {
  v1::CoordinatorMessage message;
  v1::Reconfigure* reconfigure = message.mutable_reconfigure();
  reconfigure->set_job_id(job);
  reconfigure->set_generation(generation);
  *reconfigure->mutable_mesh() = MeshOf({"w0", "w1"});
  reconfigure->mutable_coordinates()->set_rank(1);
  return message;
}

v1::CoordinatorMessage StopOf(const std::string& job, uint64_t generation) {
  v1::CoordinatorMessage message;
  message.mutable_stop()->set_job_id(job);
  message.mutable_stop()->set_generation(generation);
  return message;
}

v1::CoordinatorMessage SuspendOf(const std::string& job, uint64_t generation) {
  v1::CoordinatorMessage message;
  message.mutable_suspend()->set_job_id(job);
  message.mutable_suspend()->set_generation(generation);
  message.mutable_suspend()->set_reason("re-plan");
  return message;
}

v1::CoordinatorMessage WarmUpOf(const std::string& job, uint64_t sequence) {
  v1::CoordinatorMessage message;
  message.mutable_warm_up()->set_job_id(job);
  message.mutable_warm_up()->set_sequence(sequence);
  message.mutable_warm_up()->set_generation(1);
  return message;
}

v1::Welcome WelcomeFrom(const std::string& coordinator) {
  v1::Welcome welcome;
  welcome.set_coordinator_id(coordinator);
  return welcome;
}

v1::HeldState HeldAt(uint64_t generation, int64_t step) {
  v1::HeldState held;
  held.set_generation(generation);
  held.set_step(step);
  return held;
}

class WorkerProtocolTest : public ::testing::Test {
 protected:
  // Receives `message`, takes it off the queue and decides it.
  std::optional<CommandDecision> Deliver(const v1::CoordinatorMessage& message) {
    protocol_.Receive(message);
    std::optional<v1::CoordinatorMessage> next = protocol_.NextCommand();
    if (!next.has_value()) return std::nullopt;
    return protocol_.Decide(*next);
  }

  // Assigns (job, generation) and finishes its Prepare with `prepared`.
  v1::AssignmentStatus AssignAndPrepare(const std::string& job, uint64_t generation,
                                        const absl::Status& prepared = absl::OkStatus()) {
    std::optional<CommandDecision> decision = Deliver(AssignOf(job, generation));
    EXPECT_TRUE(decision.has_value());
    EXPECT_EQ(decision->kind, Kind::kPrepare);
    protocol_.Hold(decision->assignment);
    return protocol_.FinishPrepare(decision->assignment, prepared, {}, {});
  }

  WorkerProtocol protocol_{"w0"};
};

TEST_F(WorkerProtocolTest, ACommandOlderThanOneCommandedIsSkippedEvenWithNothingHeld) {
  protocol_.OnWelcome(WelcomeFrom("c1"), {});
  ASSERT_TRUE(Deliver(StopOf("job", 4)).has_value());
  protocol_.FinishStop(StopOf("job", 4).stop());
  EXPECT_FALSE(protocol_.held().has_value());
  // A Suspend of generation 3, overtaken by the Stop of 4: never executed.
  EXPECT_FALSE(Deliver(SuspendOf("job", 3)).has_value());
  EXPECT_TRUE(Deliver(SuspendOf("job", 4)).has_value());
}

TEST_F(WorkerProtocolTest, AnotherCoordinatorStartsTheGenerationsAfresh) {
  protocol_.OnWelcome(WelcomeFrom("c1"), {});
  ASSERT_TRUE(Deliver(StopOf("job", 9)).has_value());
  protocol_.OnWelcome(WelcomeFrom("c1"), {});  // the same one, re-attached
  EXPECT_FALSE(Deliver(StopOf("job", 2)).has_value());
  protocol_.OnWelcome(WelcomeFrom("c2"), {});  // an empty data dir reuses job ids
  EXPECT_TRUE(Deliver(StopOf("job", 2)).has_value());
}

TEST_F(WorkerProtocolTest, AnAssignIsPreparedHeldAndReportedReadyWithItsPhases) {
  std::optional<CommandDecision> decision = Deliver(AssignOf("job", 3, /*rank=*/1));
  ASSERT_TRUE(decision.has_value());
  ASSERT_EQ(decision->kind, Kind::kPrepare);
  EXPECT_FALSE(decision->stop_first);
  EXPECT_EQ(decision->assignment.job_id, JobId("job"));
  EXPECT_EQ(decision->assignment.generation, Generation(3));
  EXPECT_EQ(decision->assignment.participant, 1);
  EXPECT_FALSE(protocol_.held().has_value()) << "held only once the caller holds it";
  protocol_.Hold(decision->assignment);
  ASSERT_TRUE(protocol_.HeldForHello().has_value());
  EXPECT_EQ(protocol_.HeldForHello()->generation(), 3u);
  v1::PreparePhases phases;
  phases.set_build_seconds(1.5);
  const v1::AssignmentStatus ready =
      protocol_.FinishPrepare(decision->assignment, absl::OkStatus(), {}, phases);
  EXPECT_EQ(ready.state(), v1::ASSIGNMENT_STATE_READY);
  EXPECT_DOUBLE_EQ(ready.prepare().build_seconds(), 1.5);
  EXPECT_EQ(protocol_.held_state(), v1::ASSIGNMENT_STATE_READY);
}

TEST_F(WorkerProtocolTest, ARepeatedAssignIsAnsweredWithTheHeldStateAndNotPreparedAgain) {
  AssignAndPrepare("job", 3);
  std::optional<CommandDecision> repeat = Deliver(AssignOf("job", 3));
  ASSERT_TRUE(repeat.has_value());
  EXPECT_EQ(repeat->kind, Kind::kSay);
  EXPECT_EQ(repeat->status.state(), v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(repeat->status.generation(), 3u);
}

TEST_F(WorkerProtocolTest, AnAssignOfAnotherJobStopsTheHeldOneFirst) {
  AssignAndPrepare("old", 1);
  std::optional<CommandDecision> decision = Deliver(AssignOf("new", 1));
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->kind, Kind::kPrepare);
  EXPECT_TRUE(decision->stop_first);
}

TEST_F(WorkerProtocolTest, AReconfigureBeforeAnyAssignJoinsFromItWhenItCarriesTheSpec) {
  v1::CoordinatorMessage reconfigure = ReconfigureOf("job", 5);
  *reconfigure.mutable_reconfigure()->mutable_spec() = AssignOf("job", 5).assign().spec();
  std::optional<CommandDecision> decision = Deliver(reconfigure);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->kind, Kind::kPrepare);
  EXPECT_EQ(decision->assignment.generation, Generation(5));
  EXPECT_EQ(decision->assignment.spec.name(), "job");
}

TEST_F(WorkerProtocolTest, AReconfigureOfAJobNotHeldWithoutTheSpecFailsNamingWorkerAndJob) {
  std::optional<CommandDecision> decision = Deliver(ReconfigureOf("job", 5));
  ASSERT_TRUE(decision.has_value());
  ASSERT_EQ(decision->kind, Kind::kSay);
  EXPECT_EQ(decision->status.state(), v1::ASSIGNMENT_STATE_FAILED);
  EXPECT_THAT(decision->status.message(), HasSubstr("worker w0 does not hold job job"));
}

TEST_F(WorkerProtocolTest, AReconfigureMovesTheHeldAssignmentToItsGenerationKeepingTheSpec) {
  AssignAndPrepare("job", 1);
  std::optional<CommandDecision> decision = Deliver(ReconfigureOf("job", 2));
  ASSERT_TRUE(decision.has_value());
  ASSERT_EQ(decision->kind, Kind::kPrepare);
  EXPECT_EQ(decision->assignment.generation, Generation(2));
  EXPECT_EQ(decision->assignment.spec.name(), "job");
  EXPECT_EQ(decision->assignment.participant, 1);
  // A repeat of a generation held SUSPENDED is answered with the trainer's states.
  protocol_.Hold(decision->assignment);
  protocol_.FinishPrepare(decision->assignment, absl::UnavailableError("peer gone"), {}, {});
  std::optional<CommandDecision> repeat = Deliver(ReconfigureOf("job", 2));
  ASSERT_TRUE(repeat.has_value());
  EXPECT_EQ(repeat->kind, Kind::kSayHeldStates);
  EXPECT_EQ(repeat->status.state(), v1::ASSIGNMENT_STATE_SUSPENDED);
}

TEST_F(WorkerProtocolTest, ADonorIsNumberedAfterTheMembersOrRefusedWhenThePlanOmitsIt) {
  AssignAndPrepare("job", 1);
  v1::CoordinatorMessage donor = ReconfigureOf("job", 2);
  donor.mutable_reconfigure()->set_role(v1::RECONFIGURE_ROLE_DONOR);
  donor.mutable_reconfigure()->mutable_recovery()->add_donors()->set_worker_id("w7");
  donor.mutable_reconfigure()->mutable_recovery()->add_donors()->set_worker_id("w0");
  std::optional<CommandDecision> decision = Deliver(donor);
  ASSERT_TRUE(decision.has_value());
  ASSERT_EQ(decision->kind, Kind::kDonate);
  EXPECT_TRUE(decision->donate_refused.ok());
  EXPECT_EQ(decision->assignment.participant, 2 + 1);  // two members, second donor

  WorkerProtocol other("w9");
  other.Receive(AssignOf("job", 1));
  CommandDecision assign = other.Decide(*other.NextCommand());
  other.Hold(assign.assignment);
  other.FinishPrepare(assign.assignment, absl::OkStatus(), {}, {});
  other.Receive(donor);
  const CommandDecision refused = other.Decide(*other.NextCommand());
  ASSERT_EQ(refused.kind, Kind::kDonate);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.donate_refused));
  other.Hold(refused.assignment);
  const v1::AssignmentStatus status = other.FinishDonate(refused.assignment, refused.donate_refused);
  EXPECT_EQ(status.state(), v1::ASSIGNMENT_STATE_DONATED);
  EXPECT_THAT(status.message(), HasSubstr("not among the plan's donors"));
  // The source state is kept for the next re-plan.
  EXPECT_TRUE(other.held().has_value());
  EXPECT_EQ(other.held_state(), v1::ASSIGNMENT_STATE_SUSPENDED);
}

TEST_F(WorkerProtocolTest, APrepareCutShortByAPeerIsSuspendedNamingTheWorkerBehindIt) {
  std::optional<CommandDecision> decision = Deliver(AssignOf("job", 2));
  ASSERT_TRUE(decision.has_value());
  protocol_.Hold(decision->assignment);
  const absl::Status cut = comm::WithFailedPeer(absl::UnavailableError("connection refused"), 1);
  ASSERT_EQ(PrepareOutcomeOf(cut), PrepareOutcome::kCutShort);
  const v1::AssignmentStatus status =
      protocol_.FinishPrepare(decision->assignment, cut, {HeldAt(1, 40)}, {});
  EXPECT_EQ(status.state(), v1::ASSIGNMENT_STATE_SUSPENDED);
  EXPECT_THAT(status.unreachable_workers(), ElementsAre("w1"));
  ASSERT_EQ(status.held_states_size(), 1);
  EXPECT_EQ(status.held_states(0).step(), 40);
  EXPECT_TRUE(protocol_.held().has_value());
}

TEST_F(WorkerProtocolTest, APrepareThatCannotRunFailsAndReleasesTheAssignment) {
  ASSERT_EQ(PrepareOutcomeOf(absl::ResourceExhaustedError("no memory")), PrepareOutcome::kFailed);
  const v1::AssignmentStatus status =
      AssignAndPrepare("job", 1, absl::ResourceExhaustedError("model does not fit"));
  EXPECT_EQ(status.state(), v1::ASSIGNMENT_STATE_FAILED);
  EXPECT_THAT(status.message(), HasSubstr("model does not fit"));
  EXPECT_FALSE(protocol_.held().has_value());
}

TEST_F(WorkerProtocolTest, AStaleStopOfTheHeldJobIsIgnoredAndAStopOfAnotherIsReleasedAsIs) {
  AssignAndPrepare("job", 3);
  EXPECT_EQ(protocol_.Decide(StopOf("job", 2)).kind, Kind::kNothing);
  const CommandDecision other = protocol_.Decide(StopOf("other", 1));
  EXPECT_EQ(other.kind, Kind::kStop);
  EXPECT_FALSE(other.stop_trainer);
  EXPECT_EQ(protocol_.FinishStop(StopOf("other", 1).stop()).state(),
            v1::ASSIGNMENT_STATE_RELEASED);
  EXPECT_TRUE(protocol_.held().has_value()) << "a Stop of another job keeps this one";
  const CommandDecision stop = protocol_.Decide(StopOf("job", 3));
  EXPECT_TRUE(stop.stop_trainer);
  protocol_.FinishStop(StopOf("job", 3).stop());
  EXPECT_FALSE(protocol_.held().has_value());
}

TEST_F(WorkerProtocolTest, ASuspendOfTheHeldJobSaysTheKeptStatesAndMarksItSuspended) {
  AssignAndPrepare("job", 3);
  EXPECT_EQ(protocol_.Decide(SuspendOf("job", 2)).kind, Kind::kNothing);
  EXPECT_EQ(protocol_.Decide(SuspendOf("job", 3)).kind, Kind::kSuspend);
  const v1::AssignmentStatus status =
      protocol_.FinishSuspend(SuspendOf("job", 3).suspend(), {HeldAt(3, 12), HeldAt(2, 11)});
  EXPECT_EQ(status.state(), v1::ASSIGNMENT_STATE_SUSPENDED);
  EXPECT_EQ(status.message(), "re-plan");
  EXPECT_EQ(status.held_states_size(), 2);
  EXPECT_EQ(protocol_.held_state(), v1::ASSIGNMENT_STATE_SUSPENDED);
}

TEST_F(WorkerProtocolTest, OnlySuspendAndStopInterruptFromTheReader) {
  EXPECT_EQ(InterruptTargetOf(SuspendOf("job", 4))->generation, 4u);
  EXPECT_EQ(InterruptTargetOf(StopOf("job", 5))->job_id, "job");
  EXPECT_FALSE(InterruptTargetOf(AssignOf("job", 1)).has_value());
  EXPECT_FALSE(InterruptTargetOf(WarmUpOf("job", 1)).has_value());
}

TEST_F(WorkerProtocolTest, AWarmUpOlderThanTheLastOrNamingAJobWhileHoldingOneIsIgnored) {
  std::optional<CommandDecision> warm = Deliver(WarmUpOf("next", 2));
  ASSERT_TRUE(warm.has_value());
  EXPECT_EQ(warm->kind, Kind::kWarm);
  EXPECT_EQ(warm->assignment.job_id, JobId("next"));
  EXPECT_EQ(Deliver(WarmUpOf("next", 1))->kind, Kind::kNothing);  // crossed an older call
  AssignAndPrepare("job", 1);
  std::optional<CommandDecision> busy = Deliver(WarmUpOf("next", 3));
  EXPECT_EQ(busy->kind, Kind::kNothing);
  EXPECT_EQ(busy->why, "a WarmUp of next: it holds job");
  EXPECT_EQ(Deliver(WarmUpOf("", 4))->kind, Kind::kWarm) << "a release is always applied";
  ASSERT_TRUE(protocol_.TrainingFinished(JobId("job"), Generation(1), absl::OkStatus()));
  EXPECT_EQ(Deliver(WarmUpOf("next", 5))->kind, Kind::kWarm) << "a finished job takes none";
}

TEST_F(WorkerProtocolTest, TheTrainersReportsOfAnAssignmentSinceChangedAreNotSaid) {
  AssignAndPrepare("job", 2);
  EXPECT_FALSE(protocol_.TrainingFinished(JobId("job"), Generation(1), absl::OkStatus()));
  EXPECT_FALSE(protocol_.TrainingSuspended(JobId("job"), Generation(1), {},
                                           absl::UnavailableError("peer")));
  const std::optional<v1::AssignmentStatus> failed =
      protocol_.TrainingFinished(JobId("job"), Generation(2), absl::InternalError("nan loss"));
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->state(), v1::ASSIGNMENT_STATE_FAILED);
  EXPECT_THAT(failed->message(), HasSubstr("nan loss"));
}

TEST_F(WorkerProtocolTest, ACompletedIsSaidAgainAfterAWelcomeUnlessItIsStillPending) {
  AssignAndPrepare("job", 2);
  const std::optional<v1::AssignmentStatus> completed =
      protocol_.TrainingFinished(JobId("job"), Generation(2), absl::OkStatus());
  ASSERT_TRUE(completed.has_value());
  protocol_.Say(*completed);
  v1::Progress progress;
  progress.set_step(100);
  protocol_.OnWelcome(WelcomeFrom("c1"), progress);
  EXPECT_EQ(protocol_.pending_count(), 1u) << "still pending: not said twice";
  protocol_.PopPending();  // written, and the coordinator died unread
  protocol_.OnWelcome(WelcomeFrom("c2"), progress);
  ASSERT_EQ(protocol_.pending_count(), 1u);
  EXPECT_EQ(protocol_.NextPending()->state(), v1::ASSIGNMENT_STATE_COMPLETED);
  EXPECT_EQ(protocol_.NextPending()->progress().step(), 100);
}

TEST_F(WorkerProtocolTest, PendingStatusesAreKeptInOrderAndBoundedDroppingTheOldest) {
  for (size_t i = 0; i < WorkerProtocol::kMaxPendingStatuses; ++i) {
    EXPECT_TRUE(protocol_.Say(NewStatus(JobId("job"), Generation(i + 1),
                                        v1::ASSIGNMENT_STATE_SUSPENDED)));
  }
  EXPECT_FALSE(protocol_.Say(
      NewStatus(JobId("job"), Generation(100), v1::ASSIGNMENT_STATE_SUSPENDED)));
  EXPECT_EQ(protocol_.pending_count(), WorkerProtocol::kMaxPendingStatuses);
  EXPECT_EQ(protocol_.NextPending()->generation(), 2u);
  protocol_.PopPending();
  EXPECT_EQ(protocol_.NextPending()->generation(), 3u);
}

TEST_F(WorkerProtocolTest, ADrainReleasesTheHeldAssignment) {
  AssignAndPrepare("job", 2);
  v1::CoordinatorMessage drain;
  drain.mutable_drain()->set_reason("maintenance");
  EXPECT_EQ(Deliver(drain)->kind, Kind::kDrain);
  const std::optional<v1::AssignmentStatus> released = protocol_.FinishDrain(drain.drain());
  ASSERT_TRUE(released.has_value());
  EXPECT_EQ(released->state(), v1::ASSIGNMENT_STATE_RELEASED);
  EXPECT_EQ(released->message(), "drained: maintenance");
  EXPECT_FALSE(protocol_.FinishDrain(drain.drain()).has_value());
}

}  // namespace
}  // namespace cohort::worker
