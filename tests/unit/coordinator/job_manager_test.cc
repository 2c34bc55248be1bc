#include "coordinator/jobs/job_manager.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec/defaults.h"
#include "common/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_specs.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

v1::JobSpec Spec(int tensor, int min_workers, int max_workers) {
  return testing::SmallJobSpec("train", tensor, min_workers, max_workers);
}

v1::Hello Hello(const std::string& id, const std::string& host, int index, uint64_t incarnation) {
  v1::Hello hello;
  hello.set_worker_id(id);
  hello.set_host(host);
  hello.set_device_kind(v1::DEVICE_KIND_CPU);
  hello.set_device_index(index);
  hello.set_incarnation(incarnation);
  return hello;
}

// The Hello of a member re-attaching with its place in `job`.
v1::Hello HelloHolding(const v1::MeshMember& member, const v1::Job& job) {
  v1::Hello hello = Hello(member.worker_id(), member.host(), member.device_index(),
                          member.incarnation());
  hello.mutable_held()->set_job_id(job.job_id());
  hello.mutable_held()->set_generation(job.generation());
  *hello.mutable_held()->mutable_coordinates() = member.coordinates();
  return hello;
}

// Messages of one kind sent to `worker`.
std::vector<v1::CoordinatorMessage> MessagesTo(const Effects& effects, const std::string& worker,
                                               v1::CoordinatorMessage::KindCase kind) {
  std::vector<v1::CoordinatorMessage> out;
  for (const auto& m : effects.messages) {
    if (m.worker.value() == worker && m.message.kind_case() == kind) out.push_back(m.Full());
  }
  return out;
}

int CountKind(const Effects& effects, v1::CoordinatorMessage::KindCase kind) {
  int n = 0;
  for (const auto& m : effects.messages) n += m.message.kind_case() == kind;
  return n;
}

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest() { Reset(); }

  void Reset() {
    membership_ = std::make_unique<MembershipTable>(MembershipTable::Options{});
    JobManager::Options options;
    options.readopt_grace = absl::Seconds(10);
    options.suspend_timeout = absl::Seconds(5);
    options.hang_timeout_floor = absl::Seconds(30);
    options.latest_checkpoint = [this](const JobId&) -> std::optional<Step> {
      if (!checkpoint_step_.has_value()) return std::nullopt;
      return Step(*checkpoint_step_);
    };
    jobs_ = std::make_unique<JobManager>(std::move(options), membership_.get(), &store_);
  }

  // Joins a worker as the Coordinator does: membership first, then the manager.
  Effects Join(const std::string& id, const std::string& host, int index,
               uint64_t incarnation = 0) {
    v1::Hello hello = Hello(id, host, index, incarnation ? incarnation : next_incarnation_++);
    return JoinHello(hello);
  }
  Effects JoinHello(const v1::Hello& hello) {
    EXPECT_TRUE(membership_->Join(hello, now_).ok());
    Effects effects;
    jobs_->OnWorkerJoined(hello, now_, &effects);
    return effects;
  }

  Effects Lose(const std::string& id) {
    const WorkerRecord* record = membership_->Find(WorkerId(id));
    std::optional<LostWorker> lost =
        membership_->MarkLost(WorkerId(id), record->incarnation, LossReason::kStreamBroken, now_);
    EXPECT_TRUE(lost.has_value());
    Effects effects;
    jobs_->OnWorkersLost({*lost}, now_, &effects);
    return effects;
  }

  absl::Status Report(const std::string& worker, const v1::Job& job, v1::AssignmentState state,
                      Effects* effects = nullptr, int64_t step = 0) {
    v1::AssignmentStatus status;
    status.set_job_id(job.job_id());
    status.set_generation(job.generation());
    status.set_state(state);
    if (step > 0) status.mutable_progress()->set_step(step);
    Effects local;
    return jobs_->OnAssignmentStatus(WorkerId(worker), status, now_, effects ? effects : &local);
  }

  void ReportAll(const v1::Job& job, v1::AssignmentState state) {
    for (const auto& member : job.mesh().members()) {
      ASSERT_TRUE(Report(member.worker_id(), job, state).ok());
    }
  }

  v1::Job Submit(const v1::JobSpec& spec, Effects* effects = nullptr) {
    Effects local;
    absl::StatusOr<v1::Job> job = jobs_->Submit(spec, false, now_, effects ? effects : &local);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  v1::Job Get(const v1::Job& job) { return *jobs_->Get(JobId(job.job_id())); }

  // Every current member of `job` answers its Suspend, holding the live
  // state at `step` (none when step < 0). Returns the effects of all answers.
  Effects SuspendAll(const v1::Job& job, int64_t step) {
    const v1::Job current = Get(job);
    Effects effects;
    for (const auto& member : current.mesh().members()) {
      EXPECT_TRUE(Suspended(member.worker_id(), current, step, &effects).ok());
    }
    return effects;
  }
  absl::Status Suspended(const std::string& worker, const v1::Job& job, int64_t step,
                         Effects* effects) {
    v1::AssignmentStatus status;
    status.set_job_id(job.job_id());
    status.set_generation(job.generation());
    status.set_state(v1::ASSIGNMENT_STATE_SUSPENDED);
    if (step >= 0 && job.live_state().generation() != 0) {
      v1::HeldState* held = status.add_held_states();
      held->set_generation(job.live_state().generation());
      held->set_step(step);
    }
    return jobs_->OnAssignmentStatus(WorkerId(worker), status, now_, effects);
  }

  v1::Job TwoRanksReady();

  void Heartbeat(const std::string& worker, const v1::Job& job, int64_t step, bool waiting,
                 Effects* effects) {
    v1::Heartbeat heartbeat;
    heartbeat.set_job_id(job.job_id());
    heartbeat.set_generation(job.generation());
    heartbeat.mutable_progress()->set_step(step);
    heartbeat.mutable_progress()->set_step_time_seconds(0.1);
    heartbeat.mutable_progress()->set_waiting_for_peers(waiting);
    jobs_->OnProgress(WorkerId(worker), heartbeat, now_, effects);
  }

  InMemoryJobStore store_;
  std::unique_ptr<MembershipTable> membership_;
  std::unique_ptr<JobManager> jobs_;
  absl::Time now_ = kT0;
  uint64_t next_incarnation_ = 100;
  std::optional<int64_t> checkpoint_step_;
};

TEST_F(JobManagerTest, InvalidSpecIsRefusedWithFieldMessage) {
  v1::JobSpec spec = Spec(/*tensor=*/3, 3, 3);
  Effects effects;
  absl::StatusOr<v1::Job> job = jobs_->Submit(spec, false, now_, &effects);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("parallelism.tensor"));
  EXPECT_TRUE(jobs_->List(true).empty());
}

TEST_F(JobManagerTest, ValidateOnlyCreatesNothing) {
  Effects effects;
  absl::StatusOr<v1::Job> job = jobs_->Submit(Spec(2, 2, 2), true, now_, &effects);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->job_id().empty());
  EXPECT_TRUE(jobs_->List(true).empty());
  EXPECT_TRUE(store_.LoadAll()->empty());
}

TEST_F(JobManagerTest, PendingUntilMinWorkersThenRunningWithMegatronRanks) {
  v1::Job job = Submit(Spec(2, 4, 4));
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.job_id(), "train-1");
  Join("a0", "host-a", 0);
  Join("b0", "host-b", 0);
  Join("a1", "host-a", 1);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(job).message(), HasSubstr("waiting for workers"));
  Effects effects = Join("b1", "host-b", 1);

  job = Get(job);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 1u);
  EXPECT_EQ(job.mesh().data_parallel(), 2);
  EXPECT_EQ(job.mesh().tensor_parallel(), 2);
  ASSERT_EQ(job.mesh().members_size(), 4);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kAssign), 4);
  for (int rank = 0; rank < 4; ++rank) {
    const auto& member = job.mesh().members(rank);
    EXPECT_EQ(member.coordinates().rank(), rank);
    EXPECT_EQ(member.coordinates().tensor(), rank % 2);
    EXPECT_EQ(member.coordinates().data(), rank / 2);
  }
  // Each tensor group lives on one host.
  EXPECT_EQ(job.mesh().members(0).host(), job.mesh().members(1).host());
  EXPECT_EQ(job.mesh().members(2).host(), job.mesh().members(3).host());
  // The Assign carries the worker's own coordinates and the spec.
  for (const auto& member : job.mesh().members()) {
    auto assigns = MessagesTo(effects, member.worker_id(), v1::CoordinatorMessage::kAssign);
    ASSERT_EQ(assigns.size(), 1u);
    EXPECT_EQ(assigns[0].assign().coordinates().rank(), member.coordinates().rank());
    EXPECT_EQ(assigns[0].assign().generation(), 1u);
    EXPECT_EQ(assigns[0].assign().spec().name(), "train");
  }
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(Get(job).ready_workers(), 4);
  EXPECT_EQ(Get(job).message(), "");
}

// Issue 23: GPU jobs go to GPU workers only, and a GPU job that finds none
// says so.
TEST_F(JobManagerTest, AGpuJobWaitsForGpuWorkersAndSaysWhenNoneIsAttached) {
  v1::JobSpec spec = Spec(1, 2, 2);
  spec.set_device_kind(v1::DEVICE_KIND_GPU);
  const v1::Job job = Submit(spec);
  Join("cpu0", "h", 0);
  Join("cpu1", "h", 1);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(job).message(), HasSubstr("waiting for workers: "));
  EXPECT_THAT(Get(job).message(), HasSubstr("(no GPU worker is attached)"));
  v1::Hello gpu = Hello("gpu0", "g", 0, next_incarnation_++);
  gpu.set_device_kind(v1::DEVICE_KIND_GPU);
  JoinHello(gpu);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(job).message(), ::testing::Not(HasSubstr("no GPU worker")));
  gpu = Hello("gpu1", "g", 1, next_incarnation_++);
  gpu.set_device_kind(v1::DEVICE_KIND_GPU);
  JoinHello(gpu);
  const v1::Job running = Get(job);
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  for (const v1::MeshMember& m : running.mesh().members()) {
    EXPECT_THAT(m.worker_id(), ::testing::StartsWith("gpu"));
  }
}

TEST_F(JobManagerTest, LostWorkerBumpsGenerationAndReconfiguresSurvivors) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 2, 4));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  ASSERT_EQ(job.mesh().members_size(), 4);
  const std::string victim = job.mesh().members(3).worker_id();

  // Phase 1: the survivors are asked to suspend; no new generation yet.
  Effects suspend = Lose(victim);
  EXPECT_EQ(CountKind(suspend, v1::CoordinatorMessage::kSuspend), 3);
  EXPECT_EQ(CountKind(suspend, v1::CoordinatorMessage::kReconfigure), 0);
  EXPECT_EQ(Get(job).generation(), 1u);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_THAT(Get(job).message(), HasSubstr(victim));

  // Phase 2 once every survivor answered with the state it holds.
  Effects effects = SuspendAll(job, /*step=*/12);
  v1::Job after = Get(job);
  EXPECT_EQ(after.generation(), 2u);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RECONFIGURING);
  // 3 survivors with tp 2 and 8 micro-batches: dp 1, so 2 workers remain.
  ASSERT_EQ(after.mesh().members_size(), 2);
  // Without ZeRO-1 every replica holds everything: resume from peers at 12.
  EXPECT_EQ(after.recovery().kind(), v1::RECOVERY_KIND_PEER);
  EXPECT_EQ(after.recovery().step(), 12);
  EXPECT_EQ(after.recovery().donors_size(), 0);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kReconfigure), 2);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kStop), 1);
  for (const auto& member : after.mesh().members()) {
    EXPECT_NE(member.worker_id(), victim);
    auto reconf = MessagesTo(effects, member.worker_id(), v1::CoordinatorMessage::kReconfigure);
    ASSERT_EQ(reconf.size(), 1u);
    EXPECT_EQ(reconf[0].reconfigure().generation(), 2u);
  }
  ASSERT_EQ(effects.generation_changes.size(), 1u);
  EXPECT_EQ(effects.generation_changes[0].generation, Generation(2));

  // A status from generation 1 is now stale.
  v1::Job stale = job;
  absl::Status status = Report(after.mesh().members(0).worker_id(), stale,
                               v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  ReportAll(after, v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerTest, SurvivorsKeepTheirCoordinatesWhenASpareFillsTheHole) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 4, 4));
  job = Get(job);
  Join("spare", "h", 9);  // idle: the job is at max
  EXPECT_EQ(Get(job).generation(), 1u);
  const auto before = job.mesh();
  const std::string victim = before.members(1).worker_id();
  Lose(victim);
  Effects effects = SuspendAll(job, /*step=*/0);
  v1::Job after = Get(job);
  EXPECT_EQ(after.generation(), 2u);
  ASSERT_EQ(after.mesh().members_size(), 4);
  for (const auto& old_member : before.members()) {
    if (old_member.worker_id() == victim) continue;
    for (const auto& m : after.mesh().members()) {
      if (m.worker_id() == old_member.worker_id()) {
        EXPECT_EQ(m.coordinates().rank(), old_member.coordinates().rank());
      }
    }
  }
  EXPECT_EQ(after.mesh().members(1).worker_id(), "spare");
  EXPECT_EQ(MessagesTo(effects, "spare", v1::CoordinatorMessage::kAssign).size(), 1u);
}

TEST_F(JobManagerTest, TooFewSurvivorsWaitThenResumeWhenAWorkerJoins) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 4, 4));
  Lose("w0");
  SuspendAll(job, 0);
  v1::Job waiting = Get(job);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_THAT(waiting.message(), HasSubstr("waiting for workers"));
  EXPECT_EQ(waiting.generation(), 1u);  // no runnable mesh, no new generation
  EXPECT_EQ(membership_->CountInState(WorkerState::kAssigned), 3);  // survivors stay reserved

  Effects effects = Join("w9", "h", 9);
  v1::Job resumed = Get(job);
  EXPECT_EQ(resumed.generation(), 2u);
  EXPECT_EQ(resumed.mesh().members_size(), 4);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kReconfigure), 3);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kAssign), 1);
}

TEST_F(JobManagerTest, JoiningWorkersGrowTheMeshTowardMax) {
  Join("w0", "h", 0);
  Join("w1", "h", 1);
  v1::Job job = Submit(Spec(2, 2, 4));
  EXPECT_EQ(Get(job).mesh().members_size(), 2);
  Effects none = Join("w2", "h", 2);  // 3 workers cannot form dp 1.5: no change
  EXPECT_EQ(CountKind(none, v1::CoordinatorMessage::kSuspend), 0);
  EXPECT_EQ(Get(job).generation(), 1u);
  Effects suspend = Join("w3", "h", 3);
  EXPECT_EQ(CountKind(suspend, v1::CoordinatorMessage::kSuspend), 2);
  Effects effects = SuspendAll(job, 0);
  v1::Job grown = Get(job);
  EXPECT_EQ(grown.generation(), 2u);
  EXPECT_EQ(grown.mesh().members_size(), 4);
  EXPECT_EQ(grown.mesh().data_parallel(), 2);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kReconfigure), 2);
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kAssign), 2);
  Effects at_max = Join("w4", "h", 4);
  EXPECT_EQ(CountKind(at_max, v1::CoordinatorMessage::kSuspend), 0);
  EXPECT_EQ(Get(job).generation(), 2u);
}

TEST_F(JobManagerTest, AWorkerBelongsToAtMostOneJobAndLaterJobsBackfill) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job big = Submit(Spec(2, 2, 2));
  v1::Job huge = Submit(Spec(2, 4, 4));  // cannot start: 1 idle worker
  v1::JobSpec small_spec = Spec(1, 1, 1);
  v1::Job small = Submit(small_spec);    // backfills the last idle worker
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(huge).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(small).state(), v1::JOB_STATE_RUNNING);
  std::set<std::string> used;
  for (const v1::Job& j : {Get(big), Get(small)}) {
    for (const auto& m : j.mesh().members()) EXPECT_TRUE(used.insert(m.worker_id()).second);
  }
  // Cancelling `big` frees its workers, but `huge` still needs 4.
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(big.job_id()), now_, &effects).ok());
  EXPECT_EQ(CountKind(effects, v1::CoordinatorMessage::kStop), 2);
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Get(huge).state(), v1::JOB_STATE_PENDING);
  Join("w3", "h", 3);
  Effects done;
  ASSERT_TRUE(Report(Get(small).mesh().members(0).worker_id(), Get(small),
                     v1::ASSIGNMENT_STATE_COMPLETED, &done, /*step=*/small_spec.steps())
                  .ok());
  EXPECT_EQ(Get(small).state(), v1::JOB_STATE_COMPLETED);
  // The completion carries the final step, which heartbeats may have missed.
  EXPECT_EQ(Get(small).progress().step(), small_spec.steps());
  EXPECT_EQ(Get(huge).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(huge).mesh().members_size(), 4);
}

TEST_F(JobManagerTest, CancelAndErrorsForUnknownOrFinishedJobs) {
  v1::Job job = Submit(Spec(1, 1, 1));
  Effects effects;
  EXPECT_EQ(jobs_->Cancel(JobId("nope-1"), now_, &effects).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_->Get(JobId("nope-1")).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(jobs_->Cancel(JobId(job.job_id()), now_, &effects).ok());
  EXPECT_EQ(jobs_->Cancel(JobId(job.job_id()), now_, &effects).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(jobs_->List(false).empty());
  EXPECT_EQ(jobs_->List(true).size(), 1u);
}

// Issue 21: jobs were never deleted, so their records (and Jobs.List) only
// grew. A finished job can be deleted, and is after the retention.
TEST_F(JobManagerTest, FinishedJobsAreDeletedOnRequestAndAfterTheRetention) {
  v1::Job running = Submit(Spec(1, 1, 1));
  v1::Job first = Submit(Spec(1, 1, 1));
  v1::Job second = Submit(Spec(1, 1, 1));
  EXPECT_EQ(jobs_->Delete(JobId(running.job_id())).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(jobs_->Delete(JobId("nope-1")).code(), absl::StatusCode::kNotFound);
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(first.job_id()), now_, &effects).ok());
  ASSERT_TRUE(jobs_->Delete(JobId(first.job_id())).ok());
  EXPECT_EQ(jobs_->Get(JobId(first.job_id())).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.LoadAll()->size(), 2u);

  // The default retention is 7 days after the job finished.
  ASSERT_TRUE(jobs_->Cancel(JobId(second.job_id()), now_, &effects).ok());
  now_ += absl::Hours(24 * 7) - absl::Seconds(1);
  jobs_->Tick(now_, &effects);
  EXPECT_TRUE(jobs_->Get(JobId(second.job_id())).ok());
  now_ += absl::Seconds(1);
  jobs_->Tick(now_, &effects);
  EXPECT_EQ(jobs_->Get(JobId(second.job_id())).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs_->Get(JobId(running.job_id())).ok());
  ASSERT_EQ(store_.LoadAll()->size(), 1u);
  EXPECT_EQ((*store_.LoadAll())[0].job_id(), running.job_id());
}

TEST_F(JobManagerTest, AFailedMemberFailsTheJobAndFreesTheOthers) {
  Join("w0", "h", 0);
  Join("w1", "h", 1);
  v1::Job job = Submit(Spec(2, 2, 2));
  job = Get(job);
  Effects effects;
  v1::AssignmentStatus status;
  status.set_job_id(job.job_id());
  status.set_generation(job.generation());
  status.set_state(v1::ASSIGNMENT_STATE_FAILED);
  status.set_message("out of memory");
  ASSERT_TRUE(jobs_->OnAssignmentStatus(WorkerId("w0"), status, now_, &effects).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(job).message(), HasSubstr("out of memory"));
  EXPECT_EQ(membership_->CountInState(WorkerState::kIdle), 2);
  EXPECT_EQ(effects.finished_jobs.size(), 1u);
}

TEST_F(JobManagerTest, ScaleValidatesAndShrinks) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 2, 4));
  EXPECT_EQ(Get(job).mesh().members_size(), 4);
  Effects effects;
  absl::StatusOr<v1::Job> bad = jobs_->Scale(JobId(job.job_id()), 4, 2, now_, &effects);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::Job> scaled = jobs_->Scale(JobId(job.job_id()), 2, 2, now_, &effects);
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_EQ(scaled->generation(), 1u);  // suspending first
  SuspendAll(job, 0);
  EXPECT_EQ(Get(job).mesh().members_size(), 2);
  EXPECT_EQ(Get(job).generation(), 2u);
  EXPECT_EQ(membership_->CountInState(WorkerState::kIdle), 2);
}

TEST_F(JobManagerTest, FailedPersistenceCreatesNothing) {
  store_.FailNextPut(absl::UnavailableError("disk full"));
  Effects effects;
  absl::StatusOr<v1::Job> job = jobs_->Submit(Spec(1, 1, 1), false, now_, &effects);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(jobs_->List(true).empty());
}

// A state change whose write failed stays in memory and is written by the
// next Tick (which looks only at jobs whose record is behind).
TEST_F(JobManagerTest, AFailedStateWriteIsRetriedByTheNextTick) {
  const v1::Job job = Submit(Spec(1, 1, 1));
  for (int i = 0; i < 3; ++i) Submit(Spec(1, 1, 1));
  auto stored_state = [&] {
    absl::StatusOr<std::vector<v1::Job>> all = store_.LoadAll();
    EXPECT_TRUE(all.ok()) << all.status();
    for (const v1::Job& stored : *all) {
      if (stored.job_id() == job.job_id()) return stored.state();
    }
    return v1::JOB_STATE_UNSPECIFIED;
  };
  store_.FailNextPut(absl::UnavailableError("disk full"));
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(job.job_id()), now_, &effects).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(stored_state(), v1::JOB_STATE_PENDING);
  jobs_->Tick(now_, &effects);
  EXPECT_EQ(stored_state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, RestartReadoptsReturningWorkersWithoutReplan) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 4, 4));
  job = Get(job);
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);

  // The coordinator restarts: fresh membership and manager over the same store.
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  EXPECT_EQ(jobs_->awaiting_readoption(), 4u);
  v1::Job restored = Get(job);
  EXPECT_EQ(restored.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(restored.generation(), 1u);

  // Three come back holding their place; one never does.
  for (int i = 0; i < 3; ++i) {
    const auto& member = job.mesh().members(i);
    Effects effects = JoinHello(HelloHolding(member, job));
    EXPECT_TRUE(effects.messages.empty());
  }
  EXPECT_EQ(Get(job).generation(), 1u);
  EXPECT_EQ(membership_->CountInState(WorkerState::kAssigned), 3);

  now_ += absl::Seconds(11);
  Effects effects;
  jobs_->Tick(now_, &effects);
  EXPECT_EQ(jobs_->awaiting_readoption(), 0u);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_THAT(Get(job).message(), HasSubstr(job.mesh().members(3).worker_id()));
}

TEST_F(JobManagerTest, RestartFillsWhatARecordFromBeforeAFieldLacks) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  const v1::Job job = Get(Submit(Spec(1, 3, 3)));
  ASSERT_EQ(job.mesh().data_parallel(), 3);
  // The record as a coordinator from before elastic.wait_for_workers_seconds
  // and Mesh.micro_batches wrote it.
  v1::Job old = (*store_.LoadAll())[0];
  old.mutable_spec()->mutable_elastic()->clear_wait_for_workers_seconds();
  old.mutable_mesh()->clear_micro_batches();
  ASSERT_TRUE(store_.Put(old).ok());

  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  const v1::Job restored = Get(job);
  EXPECT_EQ(restored.spec().elastic().wait_for_workers_seconds(), kDefaultWaitForWorkersSeconds);
  // The planner's split of the spec's 8 micro-batches over 3 data ranks.
  EXPECT_THAT(restored.mesh().micro_batches(), ::testing::ElementsAre(3, 3, 2));
  EXPECT_THAT(restored.mesh().micro_batches(),
              ::testing::ElementsAreArray(job.mesh().micro_batches()));
}

TEST_F(JobManagerTest, RestartReasksReadoptedWorkersWhoseReadinessWasNotRecorded) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 2, 4));
  Lose(Get(job).mesh().members(3).worker_id());
  SuspendAll(job, 0);
  v1::Job reconfiguring = Get(job);
  ASSERT_EQ(reconfiguring.state(), v1::JOB_STATE_RECONFIGURING);
  ASSERT_EQ(reconfiguring.mesh().members_size(), 2);
  // One READY reaches the old coordinator; the other dies with it.
  ASSERT_TRUE(Report(reconfiguring.mesh().members(0).worker_id(), reconfiguring,
                     v1::ASSIGNMENT_STATE_READY)
                  .ok());

  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  for (const auto& member : reconfiguring.mesh().members()) {
    Effects effects = JoinHello(HelloHolding(member, reconfiguring));
    auto reconf = MessagesTo(effects, member.worker_id(), v1::CoordinatorMessage::kReconfigure);
    ASSERT_EQ(reconf.size(), 1u) << member.worker_id();
    EXPECT_EQ(reconf[0].reconfigure().generation(), reconfiguring.generation());
    EXPECT_EQ(reconf[0].reconfigure().coordinates().rank(), member.coordinates().rank());
  }
  EXPECT_EQ(Get(job).generation(), reconfiguring.generation());
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
}

// Scheduling walks the jobs not finished, in submit order, also after a
// restart: a cancelled job is never planned, pending ones get workers first
// come, first served.
TEST_F(JobManagerTest, PendingJobsAreScheduledInSubmitOrderAndFinishedOnesNeverAlsoAfterARestart) {
  const v1::Job cancelled = Submit(Spec(1, 1, 1));
  const v1::Job first = Submit(Spec(1, 1, 1));
  const v1::Job second = Submit(Spec(1, 1, 1));
  const v1::Job third = Submit(Spec(1, 1, 1));
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(cancelled.job_id()), now_, &effects).ok());
  Join("w0", "h", 0);
  EXPECT_EQ(Get(first).mesh().members_size(), 1);
  EXPECT_EQ(Get(second).mesh().members_size(), 0);

  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  Join("w1", "h", 1);
  EXPECT_EQ(Get(cancelled).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Get(cancelled).mesh().members_size(), 0);
  EXPECT_EQ(Get(second).mesh().members_size(), 1);
  EXPECT_EQ(Get(third).mesh().members_size(), 0);
  Join("w2", "h", 2);
  EXPECT_EQ(Get(third).mesh().members_size(), 1);
}

TEST_F(JobManagerTest, RestartedWorkerProcessIsNotReadopted) {
  for (int i = 0; i < 2; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(2, 2, 2));
  job = Get(job);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  // w0 comes back as a new process (new incarnation, no held assignment).
  Effects effects = Join(job.mesh().members(0).worker_id(), "h", 0, /*incarnation=*/777);
  v1::Job after = Get(job);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_EQ(after.mesh().members_size(), 1);
}

TEST_F(JobManagerTest, WorkerHoldingAnUnknownAssignmentIsToldToStop) {
  v1::Hello hello = Hello("w0", "h", 0, 5);
  hello.mutable_held()->set_job_id("gone-7");
  hello.mutable_held()->set_generation(3);
  Effects effects = JoinHello(hello);
  auto stops = MessagesTo(effects, "w0", v1::CoordinatorMessage::kStop);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].stop().job_id(), "gone-7");
  EXPECT_EQ(stops[0].stop().generation(), 3u);
}

TEST_F(JobManagerTest, ProgressFromRankZeroIsPublished) {
  Join("w0", "h", 0);
  v1::Job job = Submit(Spec(1, 1, 1));
  job = Get(job);
  v1::Heartbeat heartbeat;
  heartbeat.set_job_id(job.job_id());
  heartbeat.set_generation(job.generation());
  heartbeat.mutable_progress()->set_step(7);
  heartbeat.mutable_progress()->set_loss(2.5);
  Effects effects;
  // Not before the member is READY: it has not restored a step yet.
  jobs_->OnProgress(WorkerId("w0"), heartbeat, now_, &effects);
  EXPECT_EQ(Get(job).progress().step(), 0);
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);
  effects = Effects();
  jobs_->OnProgress(WorkerId("w0"), heartbeat, now_, &effects);
  EXPECT_EQ(Get(job).progress().step(), 7);
  ASSERT_EQ(effects.events.size(), 1u);
  EXPECT_EQ(effects.events[0].kind, v1::JOB_EVENT_KIND_PROGRESS);
  heartbeat.set_generation(job.generation() + 5);
  heartbeat.mutable_progress()->set_step(8);
  jobs_->OnProgress(WorkerId("w0"), heartbeat, now_, &effects);
  EXPECT_EQ(Get(job).progress().step(), 7);
}

// A dp 2 job on two workers, both READY.
v1::Job JobManagerTest::TwoRanksReady() {
  Join("w0", "h", 0);
  Join("w1", "h", 1);
  const v1::Job job = Get(Submit(Spec(1, 2, 2)));
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);
  return job;
}

TEST_F(JobManagerTest, RankZerosLossesAndValidationsFormAHistoryThatSurvivesARestart) {
  const v1::Job job = TwoRanksReady();
  const std::string rank0 = job.mesh().members(0).worker_id();
  const std::string rank1 = job.mesh().members(1).worker_id();
  auto beat = [&](const std::string& worker, int64_t step, std::vector<int64_t> validated) {
    v1::Heartbeat heartbeat;
    heartbeat.set_job_id(job.job_id());
    heartbeat.set_generation(job.generation());
    heartbeat.mutable_progress()->set_step(step);
    heartbeat.mutable_progress()->set_loss(10.0 - step);
    for (int64_t s : validated) {
      v1::LossPoint* p = heartbeat.mutable_progress()->add_validation();
      p->set_step(s);
      p->set_loss(20.0 - s);
    }
    Effects effects;
    jobs_->OnProgress(WorkerId(worker), heartbeat, now_, &effects);
    return effects;
  };
  beat(rank0, 1, {});
  beat(rank1, 2, {2});  // not rank 0: ignored
  beat(rank0, 2, {2});
  beat(rank0, 2, {2});  // a repeat adds nothing
  beat(rank0, 4, {2, 4});
  // The last step's validation comes with a heartbeat of the same step.
  Effects last = beat(rank0, 4, {2, 4, 5});
  ASSERT_EQ(last.events.size(), 1u);
  EXPECT_EQ(last.events[0].kind, v1::JOB_EVENT_KIND_PROGRESS);

  auto check = [&](const v1::LossHistory& history) {
    ASSERT_EQ(history.training_size(), 3);
    EXPECT_EQ(history.training(2).step(), 4);
    EXPECT_EQ(history.training(2).loss(), 6.0);
    ASSERT_EQ(history.validation_size(), 3);
    EXPECT_EQ(history.validation(0).step(), 2);
    EXPECT_EQ(history.validation(2).step(), 5);
    EXPECT_EQ(history.validation(2).loss(), 15.0);
  };
  absl::StatusOr<v1::LossHistory> history = jobs_->LossHistory(JobId(job.job_id()));
  ASSERT_TRUE(history.ok()) << history.status();
  check(*history);
  // The job's progress shows the newest validations, and no history.
  EXPECT_EQ(Get(job).progress().validation_size(), 3);
  EXPECT_FALSE(Get(job).has_loss_history());
  EXPECT_EQ(jobs_->LatestValidationLosses().at(job.job_id()), 15.0);
  EXPECT_TRUE(absl::IsNotFound(jobs_->LossHistory(JobId("nope")).status()));

  // Points alone are written by Tick, at most every kHistoryPersistInterval.
  now_ += kHistoryPersistInterval;
  Effects tick;
  jobs_->Tick(now_, &tick);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  history = jobs_->LossHistory(JobId(job.job_id()));
  ASSERT_TRUE(history.ok()) << history.status();
  check(*history);
  EXPECT_FALSE(Get(job).has_loss_history()) << "restored into the history, not the job";
  // The validation loss gauge's source survives the restart and goes with
  // the job's record.
  EXPECT_EQ(jobs_->LatestValidationLosses().at(job.job_id()), 15.0);
  Effects cancel;
  ASSERT_TRUE(jobs_->Cancel(JobId(job.job_id()), now_, &cancel).ok());
  EXPECT_EQ(jobs_->LatestValidationLosses().count(job.job_id()), 1u) << "a finished job's stays";
  ASSERT_TRUE(jobs_->Delete(JobId(job.job_id())).ok());
  EXPECT_TRUE(jobs_->LatestValidationLosses().empty());
}

v1::CheckpointFailure CheckpointFailureAt(int64_t step, absl::Time time,
                                          v1::CheckpointFailureKind kind,
                                          const std::string& reason) {
  v1::CheckpointFailure failure;
  failure.set_step(step);
  failure.set_generation(1);
  *failure.mutable_time() = ToProtoTime(time);
  failure.set_kind(kind);
  failure.set_reason(reason);
  return failure;
}

v1::CheckpointCommit CheckpointCommitAt(int64_t step, absl::Time time) {
  v1::CheckpointCommit commit;
  commit.set_step(step);
  commit.set_generation(1);
  *commit.mutable_time() = ToProtoTime(time);
  return commit;
}

// Issue 43: a full disk failed every checkpoint and only the coordinator's
// log said so. The job's record keeps the newest commit, the newest failure
// and the count, publishes each change, and survives a restart.
TEST_F(JobManagerTest, CheckpointCommitsAndFailuresAreKeptOnTheJobAcrossARestart) {
  const v1::Job job = Submit(Spec(1, 1, 1));
  const JobId id(job.job_id());
  EXPECT_FALSE(Get(job).has_checkpoint_status());
  Effects committed;
  jobs_->OnCheckpointCommitted(id, CheckpointCommitAt(100, now_), &committed);
  ASSERT_EQ(committed.events.size(), 1u);
  EXPECT_EQ(committed.events[0].kind, v1::JOB_EVENT_KIND_CHECKPOINT);
  EXPECT_EQ(committed.events[0].job.checkpoint_status().last_commit().step(), 100);

  const std::string no_space =
      "RocksDB write of a chunk of param/w for job train-1 step 200 generation 1 in data dir "
      "/data/checkpoints failed: IO error: No space left on device";
  now_ += absl::Minutes(1);
  Effects failed;
  jobs_->OnCheckpointFailed(
      id, CheckpointFailureAt(200, now_, v1::CHECKPOINT_FAILURE_KIND_STORAGE, no_space), &failed);
  ASSERT_EQ(failed.events.size(), 1u);
  EXPECT_EQ(failed.events[0].kind, v1::JOB_EVENT_KIND_CHECKPOINT);
  EXPECT_EQ(failed.events[0].job.checkpoint_status().failed_attempts(), 1);
  // A report from another thread that arrives late counts, but does not
  // replace the newer failure; an older step's commit changes nothing.
  Effects late;
  jobs_->OnCheckpointFailed(id,
                            CheckpointFailureAt(150, now_ - absl::Seconds(30),
                                                v1::CHECKPOINT_FAILURE_KIND_ABANDONED, "idle"),
                            &late);
  jobs_->OnCheckpointCommitted(id, CheckpointCommitAt(90, now_), &late);
  // An unknown (deleted) job's reports are dropped.
  jobs_->OnCheckpointFailed(JobId("gone-9"),
                            CheckpointFailureAt(1, now_, v1::CHECKPOINT_FAILURE_KIND_STORAGE, "x"),
                            &late);
  EXPECT_EQ(late.events.size(), 1u) << "only the late failure changed the job";

  auto check = [&](const v1::CheckpointStatus& status) {
    EXPECT_EQ(status.last_commit().step(), 100);
    EXPECT_EQ(FromProtoTime(status.last_commit().time()), now_ - absl::Minutes(1));
    EXPECT_EQ(status.last_failure().step(), 200);
    EXPECT_EQ(status.last_failure().generation(), 1u);
    EXPECT_EQ(status.last_failure().kind(), v1::CHECKPOINT_FAILURE_KIND_STORAGE);
    EXPECT_EQ(status.last_failure().reason(), no_space);
    EXPECT_EQ(FromProtoTime(status.last_failure().time()), now_);
    EXPECT_EQ(status.failed_attempts(), 2);
  };
  check(Get(job).checkpoint_status());
  // A later commit keeps the failure: the reader sees both, and their times.
  now_ += absl::Seconds(5);
  jobs_->OnCheckpointCommitted(id, CheckpointCommitAt(300, now_), &late);
  EXPECT_EQ(Get(job).checkpoint_status().last_commit().step(), 300);
  EXPECT_EQ(Get(job).checkpoint_status().last_failure().step(), 200);

  // The next tick writes the record (not the report itself: a commit's
  // reply does not wait for it), and after a restart the status comes back
  // with the job.
  const v1::CheckpointStatus before = Get(job).checkpoint_status();
  absl::StatusOr<std::vector<v1::Job>> stored = store_.LoadAll();
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_NE((*stored)[0].checkpoint_status().SerializeAsString(), before.SerializeAsString())
      << "written before the tick";
  Effects ticked;
  jobs_->Tick(now_, &ticked);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  EXPECT_EQ(Get(job).checkpoint_status().SerializeAsString(), before.SerializeAsString());
  EXPECT_EQ(Get(job).checkpoint_status().failed_attempts(), 2);
}

// A store's message is kept to kCheckpointReasonBytes and made printable:
// it is in every Job reply and on the user's terminal.
TEST_F(JobManagerTest, ACheckpointFailuresReasonIsBoundedAndPrintable) {
  const v1::Job job = Submit(Spec(1, 1, 1));
  const std::string reason = "IO error:\n\x1b[2J" + std::string(2000, 'x');
  Effects effects;
  jobs_->OnCheckpointFailed(
      JobId(job.job_id()),
      CheckpointFailureAt(10, now_, v1::CHECKPOINT_FAILURE_KIND_STORAGE, reason), &effects);
  const std::string kept = Get(job).checkpoint_status().last_failure().reason();
  EXPECT_THAT(kept, ::testing::StartsWith("IO error:\\n\\x1b[2Jxxx"));
  EXPECT_THAT(kept, ::testing::EndsWith(absl::StrCat("...(", reason.size(), " bytes)")));
  EXPECT_LE(kept.size(), kCheckpointReasonBytes + 32);
  for (char c : kept) EXPECT_TRUE(absl::ascii_isprint(c)) << static_cast<int>(c);
}

// CountByState is kept as jobs come, change state and go (the gauges read it
// on every tick); it must equal a count over every job at each point.
TEST_F(JobManagerTest, CountsByStateFollowSubmitsStateChangesDeletesAndRestarts) {
  std::vector<std::string> ids;
  auto expect_counts = [&](const std::string& when) {
    std::map<v1::JobState, int> counted;
    for (const std::string& id : ids) {
      absl::StatusOr<v1::Job> job = jobs_->Get(JobId(id));
      if (job.ok()) ++counted[job->state()];
    }
    EXPECT_EQ(jobs_->CountByState(), counted) << when;
  };
  for (int i = 0; i < 5; ++i) ids.push_back(Submit(Spec(1, 1, 1)).job_id());
  expect_counts("after five submits");
  Join("w0", "h", 0);
  Join("w1", "h", 1);
  expect_counts("after two were scheduled");
  Effects effects;
  ASSERT_TRUE(jobs_->Cancel(JobId(ids[0]), now_, &effects).ok());
  ASSERT_TRUE(jobs_->Cancel(JobId(ids[4]), now_, &effects).ok());
  expect_counts("after two cancels");
  ASSERT_TRUE(jobs_->Delete(JobId(ids[4])).ok());
  ASSERT_FALSE(jobs_->Delete(JobId(ids[1])).ok()) << "only a finished job can be deleted";
  expect_counts("after a delete and a refused one");
  EXPECT_EQ(jobs_->List(/*include_finished=*/true).size(), 4u);
  Reset();
  ASSERT_TRUE(jobs_->Restore(now_).ok());
  expect_counts("after a restart");
  ASSERT_TRUE(jobs_->Delete(JobId(ids[0])).ok());
  expect_counts("after deleting a restored job");
  ids.push_back(Submit(Spec(1, 1, 1)).job_id());
  expect_counts("after a submit following the restart");
  EXPECT_EQ(jobs_->List(/*include_finished=*/true).size(), 4u);
}

TEST_F(JobManagerTest, TheFinalStepJoinsTheHistoryWhicheverMemberCompletesFirst) {
  const v1::Job job = TwoRanksReady();
  const std::string rank0 = job.mesh().members(0).worker_id();
  const std::string rank1 = job.mesh().members(1).worker_id();
  auto complete = [&](const std::string& worker) {
    v1::AssignmentStatus status;
    status.set_job_id(job.job_id());
    status.set_generation(job.generation());
    status.set_state(v1::ASSIGNMENT_STATE_COMPLETED);
    status.mutable_progress()->set_step(job.spec().steps());
    status.mutable_progress()->set_loss(1.25);
    v1::LossPoint* validation = status.mutable_progress()->add_validation();
    validation->set_step(job.spec().steps());
    validation->set_loss(1.5);
    Effects effects;
    return jobs_->OnAssignmentStatus(WorkerId(worker), status, now_, &effects);
  };
  // The last heartbeat came before the last step; rank 1 reports first.
  ASSERT_TRUE(complete(rank1).ok());
  ASSERT_TRUE(complete(rank0).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_COMPLETED);
  absl::StatusOr<v1::LossHistory> history = jobs_->LossHistory(JobId(job.job_id()));
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->training_size(), 1);
  EXPECT_EQ(history->training(0).step(), job.spec().steps());
  EXPECT_EQ(history->training(0).loss(), 1.25);
  ASSERT_EQ(history->validation_size(), 1);
  EXPECT_EQ(history->validation(0).loss(), 1.5);
}

// dp 4 with ZeRO-1 and the default mirror on the next data rank.
v1::JobSpec Zero1Spec(int min_workers, int max_workers, int optimizer_replicas = 0) {
  v1::JobSpec spec = Spec(1, min_workers, max_workers);
  spec.mutable_parallelism()->set_zero1(true);
  spec.mutable_elastic()->set_optimizer_replicas(optimizer_replicas);
  return spec;
}

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

// --- Warm spares (WarmSpares, through JobManager) ---

TEST_F(JobManagerTest, AnIdleWorkerLeftOverPreparesTheLastPlaceAndIsReleasedWhenTheJobEnds) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  Effects submitted;
  v1::Job job = Submit(Spec(1, 2, 2), &submitted);
  job = Get(job);
  ASSERT_EQ(job.mesh().members_size(), 2);
  const std::string spare = "w2";
  ASSERT_TRUE(membership_->Find(WorkerId(spare))->state == WorkerState::kIdle);
  // The spare is told the job, its spec and mesh, and the place to prepare:
  // the mesh's last rank.
  auto warm = MessagesTo(submitted, spare, v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].warm_up().job_id(), job.job_id());
  EXPECT_EQ(warm[0].warm_up().generation(), job.generation());
  EXPECT_EQ(warm[0].warm_up().coordinates().rank(), 1);
  EXPECT_EQ(warm[0].warm_up().mesh().members_size(), 2);
  EXPECT_EQ(warm[0].warm_up().spec().steps(), job.spec().steps());
  // Members get none.
  EXPECT_TRUE(MessagesTo(submitted, "w0", v1::CoordinatorMessage::kWarmUp).empty());
  // Nothing changed, nothing sent again.
  Effects ready;
  for (const auto& member : job.mesh().members()) {
    ASSERT_TRUE(Report(member.worker_id(), job, v1::ASSIGNMENT_STATE_READY, &ready).ok());
  }
  EXPECT_EQ(CountKind(ready, v1::CoordinatorMessage::kWarmUp), 0);
  // The job ends: the spare is released (a WarmUp without a job).
  Effects done;
  for (const auto& member : job.mesh().members()) {
    ASSERT_TRUE(Report(member.worker_id(), job, v1::ASSIGNMENT_STATE_COMPLETED, &done).ok());
  }
  warm = MessagesTo(done, spare, v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_TRUE(warm[0].warm_up().job_id().empty());
}

TEST_F(JobManagerTest, ASpareTakenIntoTheMeshIsNotReleasedAndTheNextIdleWorkerTakesItsRole) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(2, 2));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  const std::string victim = job.mesh().members(1).worker_id();
  std::string spare;
  for (const std::string id : {"w0", "w1", "w2"}) {
    if (membership_->Find(WorkerId(id))->state == WorkerState::kIdle) spare = id;
  }
  ASSERT_FALSE(spare.empty());
  Lose(victim);
  Effects effects = SuspendAll(job, /*step=*/10);
  v1::Job after = Get(job);
  ASSERT_EQ(after.generation(), 2u);
  ASSERT_EQ(after.mesh().members(1).worker_id(), spare);
  EXPECT_EQ(MessagesTo(effects, spare, v1::CoordinatorMessage::kAssign).size(), 1u);
  EXPECT_TRUE(MessagesTo(effects, spare, v1::CoordinatorMessage::kWarmUp).empty());
  // A new idle worker becomes the spare of the new generation's last place.
  Effects joined = Join("w3", "h", 3);
  auto warm = MessagesTo(joined, "w3", v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].warm_up().job_id(), after.job_id());
  EXPECT_EQ(warm[0].warm_up().generation(), 2u);
  EXPECT_EQ(warm[0].warm_up().coordinates().rank(), 1);
}

TEST_F(JobManagerTest, ASpareIsNotReleasedWhileItsJobIsSuspended) {
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Zero1Spec(1, 2));
  ReportAll(Get(job), v1::ASSIGNMENT_STATE_READY);
  job = Get(job);
  ASSERT_EQ(job.mesh().members_size(), 2);
  std::string spare;
  for (const std::string id : {"w0", "w1", "w2"}) {
    if (membership_->Find(WorkerId(id))->state == WorkerState::kIdle) spare = id;
  }
  ASSERT_FALSE(spare.empty());
  // A member is lost: the survivor is asked to suspend, and until the plan
  // takes the spare, the spare keeps what it prepared (no release).
  Effects lost = Lose(job.mesh().members(0).worker_id());
  ASSERT_EQ(CountKind(lost, v1::CoordinatorMessage::kSuspend), 1);
  EXPECT_TRUE(MessagesTo(lost, spare, v1::CoordinatorMessage::kWarmUp).empty());
}

TEST_F(JobManagerTest, AWarmSpareLostIsReplacedByTheNextIdleWorker) {
  for (int i = 0; i < 4; ++i) Join(absl::StrCat("w", i), "h", i);
  v1::Job job = Submit(Spec(1, 2, 2));
  job = Get(job);
  std::vector<std::string> idle;
  for (const std::string id : {"w0", "w1", "w2", "w3"}) {
    if (membership_->Find(WorkerId(id))->state == WorkerState::kIdle) idle.push_back(id);
  }
  ASSERT_EQ(idle.size(), 2u);
  // One spare per job: the first idle worker; the spare dies.
  Effects lost = Lose(idle[0]);
  auto warm = MessagesTo(lost, idle[1], v1::CoordinatorMessage::kWarmUp);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].warm_up().job_id(), job.job_id());
  EXPECT_EQ(warm[0].warm_up().coordinates().rank(), 1);
  EXPECT_TRUE(MessagesTo(lost, idle[0], v1::CoordinatorMessage::kWarmUp).empty());
}

// Each running job has its own spare; a spare keeps its job when an idle
// worker that sorts before it arrives (its prepared session stays useful),
// and only when a job ends does its spare go to another.
TEST_F(JobManagerTest, EachJobKeepsItsOwnSpareAsIdleWorkersComeAndGo) {
  for (int i = 0; i < 6; ++i) Join(absl::StrCat("w", i), "h", i);
  const v1::Job first = Get(Submit(Spec(1, 2, 2)));
  const v1::Job second = Get(Submit(Spec(1, 2, 2)));
  ASSERT_EQ(first.mesh().members_size(), 2);
  ASSERT_EQ(second.mesh().members_size(), 2);
  std::vector<std::string> idle;
  for (int i = 0; i < 6; ++i) {
    const std::string id = absl::StrCat("w", i);
    if (membership_->Find(WorkerId(id))->state == WorkerState::kIdle) idle.push_back(id);
  }
  ASSERT_EQ(idle.size(), 2u);
  // An idle worker first in the idle order (host "a" < "h") changes no one's role.
  Effects joined = Join("early", "a", 0);
  EXPECT_EQ(CountKind(joined, v1::CoordinatorMessage::kWarmUp), 0);
  // The first job ends: its spare, and only it, is released (the second's
  // is not told again; the newcomer and the freed members stay unnamed).
  Effects done;
  for (const auto& member : first.mesh().members()) {
    ASSERT_TRUE(Report(member.worker_id(), first, v1::ASSIGNMENT_STATE_COMPLETED, &done).ok());
  }
  ASSERT_EQ(CountKind(done, v1::CoordinatorMessage::kWarmUp), 1);
  int released = 0;
  for (const std::string& id : idle) {
    for (const auto& warm : MessagesTo(done, id, v1::CoordinatorMessage::kWarmUp)) {
      EXPECT_TRUE(warm.warm_up().job_id().empty())
          << id << " named a spare of " << warm.warm_up().job_id();
      ++released;
    }
  }
  EXPECT_EQ(released, 1);
}

TEST_F(JobManagerTest, NoWarmSparesWhenTurnedOff) {
  membership_ = std::make_unique<MembershipTable>(MembershipTable::Options{});
  JobManager::Options options;
  options.warm_spares_per_job = 0;
  jobs_ = std::make_unique<JobManager>(std::move(options), membership_.get(), &store_);
  for (int i = 0; i < 3; ++i) Join(absl::StrCat("w", i), "h", i);
  Effects submitted;
  Submit(Spec(1, 2, 2), &submitted);
  EXPECT_EQ(CountKind(submitted, v1::CoordinatorMessage::kWarmUp), 0);
}

}  // namespace
}  // namespace cohort::coordinator
