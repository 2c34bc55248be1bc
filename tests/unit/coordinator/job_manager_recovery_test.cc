// JobManager: recovery from lost, stalled, drained and returning members,
// donors, and the timeouts that fence or fail (the fixture is
// job_manager_fixture.h).

#include "coordinator/jobs/job_manager.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/job_manager_fixture.h"

namespace cohort::coordinator::job_manager_test {
namespace {

using ::testing::HasSubstr;

TEST_F(JobManagerTest, SpareTakesALostRanksPlaceWithPeerRecovery) {
  for (int i = 0; i < 5; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(4, 4));
  EXPECT_EQ(Get(job).spec().elastic().optimizer_replicas(), 2);  // the default
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  ASSERT_EQ(job.live_state().generation(), 1u);
  const std::string victim = job.mesh().members(2).worker_id();
  now_ += absl::Milliseconds(100);
  Lose(victim);
  now_ += absl::Milliseconds(5);
  Effects effects = SuspendAll(job, /*step=*/40);
  v1::Job after = Get(job);
  ASSERT_EQ(after.generation(), 2u);
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_PEER);
  EXPECT_EQ(after.recovery().step(), 40);
  EXPECT_EQ(after.recovery().source_generation(), 1u);
  // Rank 2's moments come from its mirror on data rank 3.
  ASSERT_EQ(after.recovery().pieces_size(), 4);
  EXPECT_EQ(after.recovery().pieces(2).optimizer_holder_rank(), 3);
  const std::string spare = after.mesh().members(2).worker_id();
  EXPECT_NE(spare, victim);
  auto assigns = MessagesTo(effects, spare, v1::CoordinatorMessage::kAssign);
  ASSERT_EQ(assigns.size(), 1u);
  EXPECT_EQ(assigns[0].assign().recovery().kind(), v1::RECOVERY_KIND_PEER);

  now_ += absl::Milliseconds(50);
  Effects ready;
  for (int i = 0; i < after.mesh().members_size(); ++i) {
    // Each member says where its Prepare's time went; the slowest counts.
    v1::AssignmentStatus status;
    status.set_job_id(after.job_id());
    status.set_generation(after.generation());
    status.set_state(v1::ASSIGNMENT_STATE_READY);
    status.mutable_prepare()->set_build_seconds(0.01 * (i + 1));
    status.mutable_prepare()->set_restore_seconds(0.02 * (4 - i));
    status.mutable_prepare()->set_session_kept(i != 1);  // survivors; the spare builds one
    status.mutable_prepare()->set_communicators_seconds(0.005 * (i + 1));
    status.mutable_prepare()->set_session_seconds(i == 1 ? 0.03 : 0.0);
    status.mutable_prepare()->set_transfer_seconds(0.01 * (4 - i));
    status.mutable_prepare()->set_mirrors_seconds(0.002);
    ASSERT_TRUE(jobs_->OnAssignmentStatus(WorkerId(after.mesh().members(i).worker_id()), status,
                                          now_, &ready)
                    .ok());
  }
  v1::Job running = Get(job);
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.live_state().generation(), 2u);
  EXPECT_DOUBLE_EQ(running.recovery_stats().last_build_seconds(), 0.04);
  EXPECT_DOUBLE_EQ(running.recovery_stats().last_restore_seconds(), 0.08);
  EXPECT_EQ(running.recovery_stats().last_sessions_kept(), after.mesh().members_size() - 1);
  // Each part is its own slowest member's.
  EXPECT_DOUBLE_EQ(running.recovery_stats().last_communicators_seconds(), 0.02);
  EXPECT_DOUBLE_EQ(running.recovery_stats().last_session_seconds(), 0.03);
  EXPECT_DOUBLE_EQ(running.recovery_stats().last_transfer_seconds(), 0.04);
  EXPECT_DOUBLE_EQ(running.recovery_stats().last_mirrors_seconds(), 0.002);
  EXPECT_EQ(running.recovery_stats().last_members(), after.mesh().members_size());
  EXPECT_EQ(running.recovery_stats().peer(), 1);
  EXPECT_EQ(running.recovery_stats().spare(), 1);
  EXPECT_EQ(running.recovery_stats().lost_steps(), 0);
  ASSERT_EQ(ready.recoveries.size(), 1u);
  EXPECT_TRUE(ready.recoveries[0].spare);
  EXPECT_EQ(ready.recoveries[0].detect_to_running, absl::Milliseconds(55));
  // Its phases (issue 24): detection to planned, planned to every member
  // READY; the first step comes later.
  EXPECT_DOUBLE_EQ(running.recovery_stats().last_suspend_seconds(), 0.005);
  EXPECT_DOUBLE_EQ(running.recovery_stats().last_prepare_seconds(), 0.050);
  EXPECT_EQ(running.recovery_stats().last_first_step_seconds(), 0);
  ASSERT_EQ(ready.recovery_phases.size(), 8u);
  EXPECT_STREQ(ready.recovery_phases[0].phase, "suspend");
  EXPECT_EQ(ready.recovery_phases[1].took, absl::Milliseconds(50));
  EXPECT_STREQ(ready.recovery_phases[3].phase, "restore");
  EXPECT_STREQ(ready.recovery_phases[4].phase, "communicators");
  EXPECT_STREQ(ready.recovery_phases[7].phase, "mirrors");
  EXPECT_EQ(ready.recovery_phases[6].took, absl::Milliseconds(40));  // transfer
  // A heartbeat at the resume step is no step; the next step is the first.
  now_ += absl::Milliseconds(30);
  Effects progress;
  v1::Heartbeat heartbeat;
  heartbeat.set_job_id(running.job_id());
  heartbeat.set_generation(running.generation());
  heartbeat.mutable_progress()->set_step(40);
  jobs_->OnProgress(WorkerId(running.mesh().members(0).worker_id()), heartbeat, now_, &progress);
  EXPECT_TRUE(progress.recovery_phases.empty());
  now_ += absl::Milliseconds(10);
  heartbeat.mutable_progress()->set_step(41);
  jobs_->OnProgress(WorkerId(running.mesh().members(1).worker_id()), heartbeat, now_, &progress);
  ASSERT_EQ(progress.recovery_phases.size(), 1u);
  EXPECT_STREQ(progress.recovery_phases[0].phase, "first_step");
  EXPECT_EQ(progress.recovery_phases[0].took, absl::Milliseconds(40));
  EXPECT_DOUBLE_EQ(Get(job).recovery_stats().last_first_step_seconds(), 0.040);
  EXPECT_DOUBLE_EQ(Get(job).recovery_stats().last_detect_to_first_step_seconds(), 0.095);
  // Once only.
  now_ += absl::Milliseconds(10);
  heartbeat.mutable_progress()->set_step(42);
  Effects later;
  jobs_->OnProgress(WorkerId(running.mesh().members(0).worker_id()), heartbeat, now_, &later);
  EXPECT_TRUE(later.recovery_phases.empty());
  bool recovered_event = false;
  for (const auto& event : ready.events) recovered_event |= event.kind == v1::JOB_EVENT_KIND_RECOVERED;
  EXPECT_TRUE(recovered_event);
}

TEST_F(JobManagerTest, LostOptimizerShardFallsBackToTheNewestCheckpoint) {
  for (int i = 0; i < 2; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(1, 2, /*optimizer_replicas=*/1));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  Effects progress;
  Heartbeat(Get(job).mesh().members(0).worker_id(), Get(job), 23, false, &progress);
  checkpoint_step_ = 20;
  Lose(Get(job).mesh().members(1).worker_id());
  SuspendAll(job, /*step=*/23);
  // The lost member's process may still be alive with its shard: the plan
  // waits for it before giving steps up (3 s after a broken stream: a live
  // process re-attaches within its backoff).
  EXPECT_EQ(Get(job).generation(), 1u);
  EXPECT_THAT(Get(job).message(), HasSubstr("waiting up to 3s for"));
  now_ += absl::Seconds(3);
  Effects tick;
  jobs_->Tick(now_, &tick);
  v1::Job after = Get(job);
  ASSERT_EQ(after.generation(), 2u);
  ASSERT_EQ(after.mesh().members_size(), 1);
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_CHECKPOINT);
  EXPECT_EQ(after.recovery().checkpoint_step(), 20);
  EXPECT_EQ(after.recovery().lost_steps(), 3);
  EXPECT_THAT(after.recovery().reason(), HasSubstr("optimizer state of source rank 1"));
}

TEST_F(JobManagerTest, EveryMemberLostAtOnceIsAwaitedAndReadoptedWithoutAReplan) {
  // A stall of the whole job: both members of a dp 2 job without
  // checkpoints are lost; the same processes come back holding generation 1.
  for (int i = 0; i < 2; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(1, 2, /*optimizer_replicas=*/1));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  Effects progress;
  Heartbeat(job.mesh().members(0).worker_id(), job, 49, false, &progress);
  Lose(job.mesh().members(0).worker_id());
  Effects last = Lose(job.mesh().members(1).worker_id());
  EXPECT_EQ(CountKind(last, v1::CoordinatorMessage::kSuspend), 0);
  v1::Job waiting = Get(job);
  EXPECT_EQ(waiting.generation(), 1u);  // nothing is given up
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_EQ(waiting.mesh().members_size(), 2);
  EXPECT_THAT(waiting.message(), HasSubstr("every member was lost at once"));
  for (int i = 0; i < 2; ++i) {
    now_ += absl::Milliseconds(130);
    const v1::MeshMember& member = job.mesh().members(i);
    Effects joined = JoinHello(HelloHolding(member, job));
    EXPECT_EQ(MessagesTo(joined, member.worker_id(), v1::CoordinatorMessage::kStop).size(), 0u);
    // Re-adopted: asked to confirm what it holds, in the same generation.
    auto confirm = MessagesTo(joined, member.worker_id(), v1::CoordinatorMessage::kReconfigure);
    ASSERT_EQ(confirm.size(), 1u);
    EXPECT_EQ(confirm[0].reconfigure().generation(), 1u);
  }
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);
  v1::Job after = Get(job);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.generation(), 1u);
  EXPECT_EQ(after.recovery_stats().lost_steps(), 0);
  EXPECT_EQ(after.message(), "");
}

TEST_F(JobManagerTest, LostHolderOfAnUnreplicatedShardRejoinsTheReplanWithItsState) {
  // tp 2: each member alone holds its shard. One is lost (its stream broke)
  // while the other survives; with the spare, the plan would start over,
  // so it waits.
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(/*tensor=*/2, 2, 2));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  const v1::MeshMember lost = job.mesh().members(1);
  Lose(lost.worker_id());
  SuspendAll(job, /*step=*/30);
  EXPECT_EQ(Get(job).generation(), 1u);
  EXPECT_THAT(Get(job).message(), HasSubstr("possibly still holding the job's state"));
  now_ += absl::Seconds(2);
  Effects joined = JoinHello(HelloHolding(lost, job));
  ASSERT_EQ(MessagesTo(joined, lost.worker_id(), v1::CoordinatorMessage::kSuspend).size(), 1u);
  Effects answered;
  ASSERT_TRUE(Suspended(lost.worker_id(), Get(job), 30, &answered).ok());
  v1::Job after = Get(job);
  ASSERT_EQ(after.generation(), 2u);
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_PEER);
  EXPECT_EQ(after.recovery().step(), 30);
  EXPECT_EQ(after.recovery().lost_steps(), 0);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(after.mesh().members(i).worker_id(), job.mesh().members(i).worker_id());
  }
}

TEST_F(JobManagerTest, NoWaitForLostMembersWhoseReturnWouldNotHelp) {
  // dp 4 with ZeRO-1 and one optimizer replica: w2's moments live only on
  // w2. w2 is killed and restarts (its state is known gone) and w0 stalls:
  // w0's return would not bring w2's shard back, so the checkpoint plan is
  // made at once.
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(1, 4, /*optimizer_replicas=*/1));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  checkpoint_step_ = 20;
  const v1::MeshMember killed = job.mesh().members(2);
  Lose(killed.worker_id());
  Join(killed.worker_id(), killed.host(), killed.device_index(), /*incarnation=*/555);
  const WorkerRecord* stalled = membership_->Find(WorkerId(job.mesh().members(0).worker_id()));
  std::optional<LostWorker> timeout = membership_->MarkLost(
      stalled->id, stalled->incarnation, LossReason::kHeartbeatTimeout, now_);
  ASSERT_TRUE(timeout.has_value());
  Effects effects;
  jobs_->OnWorkersLost({*timeout}, now_, &effects);
  SuspendAll(job, /*step=*/23);
  v1::Job after = Get(job);
  ASSERT_EQ(after.generation(), 2u) << after.message();
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_CHECKPOINT);
}

TEST_F(JobManagerTest, LostHolderBackAsANewProcessEndsTheWaitAtOnce) {
  for (int i = 0; i < 2; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(1, 2, /*optimizer_replicas=*/1));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  checkpoint_step_ = 20;
  const v1::MeshMember& lost = job.mesh().members(1);
  Lose(lost.worker_id());
  SuspendAll(job, /*step=*/23);
  EXPECT_EQ(Get(job).generation(), 1u);
  // kill -9 and restart: the old process's shard is gone, no reason to wait.
  now_ += absl::Seconds(1);
  Join(lost.worker_id(), lost.host(), lost.device_index(), /*incarnation=*/777);
  v1::Job after = Get(job);
  ASSERT_EQ(after.generation(), 2u);
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_CHECKPOINT);
  EXPECT_EQ(after.recovery().checkpoint_step(), 20);
}

TEST_F(JobManagerTest, ScaleDownLeavesOutMembersWhoDonateTheirShardsFirst) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(2, 4, /*optimizer_replicas=*/1));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  Effects effects;
  ASSERT_TRUE(jobs_->Scale(JobId(job.job_id()), 2, 2, now_, &effects).ok());
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kSuspend), 4);
  Effects plan = SuspendAll(job, 9);
  v1::Job after = Get(job);
  ASSERT_EQ(after.mesh().members_size(), 2);
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_PEER);
  // Data ranks 2 and 3 alone hold their optimizer shards.
  ASSERT_EQ(after.recovery().donors_size(), 2);
  std::vector<std::string> donors;
  for (const auto& donor : after.recovery().donors()) {
    donors.push_back(donor.worker_id());
    auto reconf = MessagesTo(plan, donor.worker_id(), v1::CoordinatorMessage::kReconfigure);
    ASSERT_EQ(reconf.size(), 1u);
    EXPECT_EQ(reconf[0].reconfigure().role(), v1::RECONFIGURE_ROLE_DONOR);
    EXPECT_TRUE(MessagesTo(plan, donor.worker_id(), v1::CoordinatorMessage::kStop).empty());
  }
  EXPECT_EQ(membership_->CountInState(WorkerState::kIdle), 0);  // donors still reserved
  v1::AssignmentStatus donated;
  donated.set_job_id(job.job_id());
  donated.set_generation(after.generation());
  donated.set_state(v1::ASSIGNMENT_STATE_DONATED);
  Effects done;
  ASSERT_TRUE(jobs_->OnAssignmentStatus(WorkerId(donors[0]), donated, now_, &done).ok());
  EXPECT_EQ(membership_->CountInState(WorkerState::kIdle), 1);
  // A second DONATED from the same worker is refused.
  EXPECT_EQ(jobs_->OnAssignmentStatus(WorkerId(donors[0]), donated, now_, &done).code(),
            absl::StatusCode::kAborted);
}

// Scale a 4-worker ZeRO-1 job to 2: the two left out donate their shards.
// Returns the job after the plan and the donors' ids.
class DonorTest : public JobManagerTest {
 protected:
  v1::Job ScaleToTwo(std::vector<std::string>* donors) {
    for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
    v1::Job job = Submit(Zero1Spec(2, 4, /*optimizer_replicas=*/1));
    ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
    Effects effects;
    EXPECT_TRUE(jobs_->Scale(JobId(job.job_id()), 2, 2, now_, &effects).ok());
    SuspendAll(Get(job), 9);
    v1::Job after = Get(job);
    for (const auto& donor : after.recovery().donors()) donors->push_back(donor.worker_id());
    return after;
  }
};

TEST_F(DonorTest, AFailedDonationReplansAtOnce) {
  std::vector<std::string> donors;
  const v1::Job planned = ScaleToTwo(&donors);
  ASSERT_EQ(donors.size(), 2u);
  v1::AssignmentStatus failed;
  failed.set_job_id(planned.job_id());
  failed.set_generation(planned.generation());
  failed.set_state(v1::ASSIGNMENT_STATE_DONATED);
  failed.set_message("CANCELLED: trainer interrupted while building communicators");
  Effects effects;
  ASSERT_TRUE(jobs_->OnAssignmentStatus(WorkerId(donors[0]), failed, now_, &effects).ok());
  // The members waiting for its pieces are asked to suspend now, not after
  // their bootstrap deadline, and so are both donors: the failed one kept
  // its state, the other may not have handed its own over yet.
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kSuspend), 4);
  for (const std::string& donor : donors) {
    EXPECT_EQ(MessagesTo(effects, donor, v1::CoordinatorMessage::kSuspend).size(), 1u) << donor;
  }
  EXPECT_EQ(membership_->CountInState(WorkerState::kIdle), 0);
  EXPECT_THAT(Get(planned).message(), HasSubstr("could not serve its state"));
  // Everyone still holds generation 1's state: the next plan recovers
  // every shard from memory, with no step lost.
  SuspendAll(Get(planned), 9);
  const v1::Job replanned = Get(planned);
  EXPECT_EQ(replanned.generation(), planned.generation() + 1);
  EXPECT_EQ(replanned.recovery().kind(), v1::RECOVERY_KIND_PEER);
  EXPECT_EQ(replanned.recovery().step(), 9);
  EXPECT_EQ(replanned.recovery().lost_steps(), 0);
}

TEST_F(DonorTest, ADonorThatHandedItsStateOverAnswersTheNextSuspensionWithNothing) {
  std::vector<std::string> donors;
  const v1::Job planned = ScaleToTwo(&donors);
  ASSERT_EQ(donors.size(), 2u);
  // A member is lost before the generation ran: the donors are asked too.
  Effects effects = Lose(planned.mesh().members(0).worker_id());
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kSuspend), 3);
  // A donation that finished meanwhile is answered by the suspension.
  v1::AssignmentStatus donated;
  donated.set_job_id(planned.job_id());
  donated.set_generation(planned.generation());
  donated.set_state(v1::ASSIGNMENT_STATE_DONATED);
  Effects late;
  EXPECT_EQ(jobs_->OnAssignmentStatus(WorkerId(donors[0]), donated, now_, &late).code(),
            absl::StatusCode::kAborted);
  ASSERT_TRUE(Suspended(donors[0], Get(planned), /*step=*/-1, &late).ok());
  EXPECT_EQ(Get(planned).generation(), planned.generation());  // two answers to come
}

TEST_F(DonorTest, ALostDonorReplansAGenerationStillPreparing) {
  std::vector<std::string> donors;
  const v1::Job planned = ScaleToTwo(&donors);
  ASSERT_EQ(donors.size(), 2u);
  Effects effects = Lose(donors[1]);
  // The two members and the other donor.
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kSuspend), 3);
  EXPECT_TRUE(MessagesTo(effects, donors[1], v1::CoordinatorMessage::kSuspend).empty());
  EXPECT_THAT(Get(planned).message(), HasSubstr("donor " + donors[1] + " lost"));
}

TEST_F(JobManagerTest, AGenerationNotReadyInTimeIsReplanned) {
  for (int i = 0; i < 2; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(1, 1, 2));
  job = Get(job);
  ASSERT_TRUE(Report(job.mesh().members(0).worker_id(), job, v1::ASSIGNMENT_STATE_READY).ok());
  Effects early;
  now_ += absl::Minutes(10) - absl::Seconds(1);
  jobs_->Tick(now_, &early);
  EXPECT_EQ(CountKind(early, v1::CoordinatorMessage::kSuspend), 0);
  Effects late;
  now_ += absl::Seconds(1);
  jobs_->Tick(now_, &late);
  EXPECT_EQ(CountKind(late, v1::CoordinatorMessage::kSuspend), 2);
  EXPECT_THAT(Get(job).message(), HasSubstr("not ready within 10m"));
  EXPECT_THAT(Get(job).message(), HasSubstr(job.mesh().members(1).worker_id() + " still preparing"));
}

TEST_F(JobManagerTest, MembersSilentAfterSuspendAreFencedAsHung) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(1, 2, 4));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  Lose(job.mesh().members(0).worker_id());
  Effects effects;
  ASSERT_TRUE(Suspended(job.mesh().members(1).worker_id(), Get(job), 3, &effects).ok());
  ASSERT_TRUE(Suspended(job.mesh().members(2).worker_id(), Get(job), 3, &effects).ok());
  EXPECT_EQ(Get(job).generation(), 1u);  // member 3 has not answered
  now_ += absl::Seconds(4);
  Effects early;
  jobs_->Tick(now_, &early);
  EXPECT_TRUE(early.lost.empty());
  now_ += absl::Seconds(2);
  Effects fenced;
  jobs_->Tick(now_, &fenced);
  ASSERT_EQ(fenced.lost.size(), 1u);
  EXPECT_EQ(fenced.lost[0].id.value(), job.mesh().members(3).worker_id());
  EXPECT_EQ(fenced.lost[0].reason, LossReason::kHang);
  v1::Job after = Get(job);
  EXPECT_EQ(after.generation(), 2u);
  EXPECT_EQ(after.mesh().members_size(), 2);
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_PEER);
}

TEST_F(JobManagerTest, StalledJobFencesTheMemberThatIsNotWaitingForPeers) {
  for (int i = 0; i < 2; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(1, 1, 2));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  const std::string w0 = job.mesh().members(0).worker_id();
  const std::string w1 = job.mesh().members(1).worker_id();
  Effects effects;
  Heartbeat(w0, job, 5, false, &effects);
  Heartbeat(w1, job, 5, false, &effects);
  // w1 hangs in compute; w0 waits for it in the allreduce.
  now_ += absl::Seconds(20);
  Heartbeat(w0, job, 5, true, &effects);
  Heartbeat(w1, job, 5, false, &effects);
  Effects early;
  jobs_->Tick(now_, &early);
  EXPECT_TRUE(early.lost.empty());
  now_ += absl::Seconds(11);
  Effects fenced;
  jobs_->Tick(now_, &fenced);
  ASSERT_EQ(fenced.lost.size(), 1u);
  EXPECT_EQ(fenced.lost[0].id.value(), w1);
  EXPECT_EQ(fenced.lost[0].reason, LossReason::kHang);
  EXPECT_EQ(CountKind(fenced, v1::CoordinatorMessage::kSuspend), 1);  // w0
}

TEST_F(JobManagerTest, JobBelowMinWorkersFailsAfterWaitingForWorkers) {
  for (int i = 0; i < 2; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::JobSpec spec = Spec(1, 2, 2);
  spec.mutable_elastic()->set_wait_for_workers_seconds(60);
  v1::Job job = Submit(spec);
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  Lose(Get(job).mesh().members(1).worker_id());
  SuspendAll(job, 4);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_THAT(Get(job).message(), HasSubstr("the survivors keep their state"));
  now_ += absl::Seconds(59);
  Effects effects;
  jobs_->Tick(now_, &effects);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RECONFIGURING);
  now_ += absl::Seconds(2);
  jobs_->Tick(now_, &effects);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(job).message(), HasSubstr("wait_for_workers_seconds"));
  EXPECT_EQ(membership_->CountInState(WorkerState::kIdle), 1);
}

TEST_F(JobManagerTest, DrainedMemberIsReplannedOutAndToldToLeave) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(1, 1, 2));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  const std::string drained = job.mesh().members(1).worker_id();
  ASSERT_TRUE(membership_->MarkDraining(WorkerId(drained)).ok());
  Effects effects;
  jobs_->OnWorkerDraining(WorkerId(drained), "maintenance", now_, &effects);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kSuspend), 2);
  Effects plan = SuspendAll(job, 6);
  v1::Job after = Get(job);
  ASSERT_EQ(after.generation(), 2u);
  for (const auto& member : after.mesh().members()) EXPECT_NE(member.worker_id(), drained);
  EXPECT_EQ(after.mesh().members_size(), 2);  // the idle worker took its place
  EXPECT_EQ(MessagesTo(plan, drained, v1::CoordinatorMessage::kDrain).size(), 1u);
  EXPECT_THAT(after.message(), HasSubstr("maintenance"));
}

TEST_F(JobManagerTest, AMemberStoppingOnItsOwnStartsTheSuspension) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(1, 1, 2));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  Effects effects;
  ASSERT_TRUE(Suspended(job.mesh().members(0).worker_id(), job, 8, &effects).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RECONFIGURING);
  // The other member is asked; the one that stopped is not asked again.
  EXPECT_EQ(MessagesTo(effects, job.mesh().members(1).worker_id(),
                       v1::CoordinatorMessage::kSuspend).size(), 1u);
  // (A second Suspend could arrive after the next generation's Reconfigure
  // and interrupt it: the donor hang the protocol simulator found.)
  EXPECT_EQ(MessagesTo(effects, job.mesh().members(0).worker_id(),
                       v1::CoordinatorMessage::kSuspend).size(), 0u);
  ASSERT_TRUE(Suspended(job.mesh().members(1).worker_id(), job, 8, &effects).ok());
  EXPECT_EQ(Get(job).generation(), 2u);
  EXPECT_EQ(Get(job).recovery().step(), 8);
}

TEST_F(JobManagerTest, RestartDuringSuspensionWaitsForReattachingMembers) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(1, 2, 4));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  // w3 comes back as a new process: its old self is lost, the others are
  // still within the grace and are not planned around.
  const auto& m3 = job.mesh().members(3);
  Join(m3.worker_id(), m3.host(), m3.device_index(), /*incarnation=*/999);
  EXPECT_EQ(Get(job).generation(), 1u);
  for (int i = 0; i < 3; ++i) {
    const auto& member = job.mesh().members(i);
    Effects effects = JoinHello(HelloHolding(member, job));
    EXPECT_EQ(MessagesTo(effects, member.worker_id(), v1::CoordinatorMessage::kSuspend).size(),
              1u);
  }
  SuspendAll(job, 11);
  v1::Job after = Get(job);
  EXPECT_EQ(after.generation(), 2u);
  EXPECT_EQ(after.mesh().members_size(), 4);  // the restarted worker joins as new
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_PEER);
  EXPECT_EQ(after.recovery().step(), 11);
}

}  // namespace
}  // namespace cohort::coordinator::job_manager_test
