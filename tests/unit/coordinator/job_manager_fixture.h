#pragma once
// The fixture of JobManager's tests (job_manager_*_test.cc): a JobManager
// over a MembershipTable and an InMemoryJobStore with a fake time, and the
// helpers that join, lose and report as the Coordinator would.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec/defaults.h"
#include "common/proto_time.h"
#include "coordinator/jobs/job_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_parts.h"
#include "tests/testing/job_specs.h"

namespace cohort::coordinator::job_manager_test {

inline const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

inline v1::JobSpec Spec(int tensor, int min_workers, int max_workers) {
  return testing::SmallJobSpec("train", tensor, min_workers, max_workers);
}

inline v1::Hello Hello(const std::string& id, const std::string& host, int index,
                       uint64_t incarnation) {
  v1::Hello hello;
  hello.set_worker_id(id);
  hello.set_host(host);
  hello.set_device_kind(v1::DEVICE_KIND_CPU);
  hello.set_device_index(index);
  hello.set_incarnation(incarnation);
  return hello;
}

// The Hello of a member re-attaching with its place in `job`.
inline v1::Hello HelloHolding(const v1::MeshMember& member, const v1::Job& job) {
  v1::Hello hello =
      Hello(member.worker_id(), member.host(), member.device_index(), member.incarnation());
  hello.mutable_held()->set_job_id(job.job_id());
  hello.mutable_held()->set_generation(job.generation());
  *hello.mutable_held()->mutable_coordinates() = member.coordinates();
  return hello;
}

// Messages of one kind sent to `worker`.
inline std::vector<v1::CoordinatorMessage> MessagesTo(const Effects& effects,
                                                      const std::string& worker,
                                                      v1::CoordinatorMessage::KindCase kind) {
  return testing::MessagesOfKind(effects, worker, kind);
}

inline int CountKind(const Effects& effects, v1::CoordinatorMessage::KindCase kind) {
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

// A dp 2 job on two workers, both READY.
inline v1::Job JobManagerTest::TwoRanksReady() {
  Join("w0", "h", 0);
  Join("w1", "h", 1);
  const v1::Job job = Get(Submit(Spec(1, 2, 2)));
  ReportAll(job, v1::ASSIGNMENT_STATE_READY);
  return job;
}

// dp 4 with ZeRO-1 and the default mirror on the next data rank.
inline v1::JobSpec Zero1Spec(int min_workers, int max_workers, int optimizer_replicas = 0) {
  v1::JobSpec spec = Spec(1, min_workers, max_workers);
  spec.mutable_parallelism()->set_zero1(true);
  spec.mutable_elastic()->set_optimizer_replicas(optimizer_replicas);
  return spec;
}

}  // namespace cohort::coordinator::job_manager_test
