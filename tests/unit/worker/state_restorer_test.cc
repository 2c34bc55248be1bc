// StateRestorer (worker/engine/state_restorer.h) on sessions of the small
// job: a fresh start draws the initial weights, a peer plan copies the
// version it names from the source generation's memory, and each way of not
// finding a checkpoint fails with the code and the words the contract gives.

#include "worker/engine/state_restorer.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "common/clock.h"
#include "coordinator/jobs/recovery_planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/engine_runs.h"
#include "tests/testing/fake_checkpoint_client.h"
#include "worker/engine/session_builder.h"

namespace cohort::worker {
namespace {

using ::testing::HasSubstr;

// A Checkpoints service that answers every manifest request with `status`.
class FailingManifests : public testing::RecordingCheckpointClient {
 public:
  explicit FailingManifests(absl::Status status) : status_(std::move(status)) {}
  absl::StatusOr<v1::CheckpointManifest> GetManifest(const std::string&, int64_t,
                                                     absl::Duration) override {
    return status_;
  }

 private:
  const absl::Status status_;
};

class StateRestorerTest : public ::testing::Test {
 protected:
  StateRestorerTest() : options_(testing::OfflineEngineOptions(&clock_)) {}

  std::unique_ptr<GenerationRun> Build(const Assignment& assignment) {
    absl::StatusOr<std::unique_ptr<GenerationRun>> run =
        builder_.Build(assignment, nullptr, nullptr, nullptr);
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? *std::move(run) : nullptr;
  }

  // Restores a fresh start of `spec` (recovery NONE) on a solo member.
  absl::StatusOr<RestoredState> RestoreFresh(const v1::JobSpec& spec) {
    std::unique_ptr<GenerationRun> run =
        Build(testing::EngineMember(spec, 1, testing::EngineMesh(1), 0));
    if (run == nullptr) return absl::InternalError("not built");
    return restorer_.Restore(testing::EngineMember(spec, 1, testing::EngineMesh(1), 0), run.get(),
                             nullptr);
  }

  // Generation 2 of a solo job, recovering from the memory of generation
  // 1's only worker, which holds `held` steps.
  static Assignment FromPeer(const v1::JobSpec& spec, int64_t held) {
    const v1::Mesh one = testing::EngineMesh(1);
    coordinator::RecoveryInput input;
    input.source = coordinator::StateSource{Generation(1), one, true, 1};
    input.holders = {{"rank-0", held}};
    input.next_mesh = one;
    Assignment next = testing::EngineMember(spec, 2, one, 0);
    next.recovery = coordinator::PlanRecovery(input);
    EXPECT_EQ(next.recovery.kind(), v1::RECOVERY_KIND_PEER) << next.recovery.reason();
    return next;
  }

  static bool SameParams(const train::TrainingSession& a, const float* b) {
    return std::memcmp(a.model().params(), b, a.model().num_params() * sizeof(float)) == 0;
  }

  FakeClock clock_;
  EngineTrainerOptions options_;
  SessionBuilder builder_{options_, nullptr, nullptr};
  const StateRestorer restorer_{options_, nullptr};
};

TEST_F(StateRestorerTest, WithoutACheckpointAFreshStartDrawsTheInitialWeights) {
  const v1::JobSpec spec = testing::EngineJobSpec(8);
  const Assignment member = testing::EngineMember(spec, 1, testing::EngineMesh(1), 0);
  std::unique_ptr<GenerationRun> run = Build(member), drawn = Build(member);
  ASSERT_NE(run, nullptr);
  ASSERT_NE(drawn, nullptr);
  drawn->session->InitializeParameters();
  ASSERT_FALSE(
      SameParams(std::as_const(*run->session), std::as_const(*drawn->session).model().params()))
      << "the session starts without its draw";
  const absl::StatusOr<RestoredState> restored = restorer_.Restore(member, run.get(), nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 0);
  EXPECT_EQ(restored->bytes, 0u);
  EXPECT_TRUE(
      SameParams(std::as_const(*run->session), std::as_const(*drawn->session).model().params()));
}

TEST_F(StateRestorerTest, APeerPlanCopiesTheVersionItNamesFromTheSourcesMemory) {
  const v1::JobSpec spec = testing::EngineJobSpec(8);
  const v1::Mesh one = testing::EngineMesh(1);
  std::unique_ptr<GenerationRun> source = Build(testing::EngineMember(spec, 1, one, 0));
  ASSERT_NE(source, nullptr);
  ASSERT_TRUE(
      restorer_.Restore(testing::EngineMember(spec, 1, one, 0), source.get(), nullptr).ok());
  train::StateVersions& versions = source->session->runner().versions();
  versions.SetCurrent(0);
  for (int64_t s = 0; s < 2; ++s) ASSERT_TRUE(source->session->RunStep(Step(s)).ok());
  // The plan resumes at step 1: the source's previous version, not the
  // weights it trains on now.
  const Assignment next = FromPeer(spec, 1);
  ASSERT_EQ(next.recovery.step(), 1);
  const absl::StatusOr<train::StateVersions::View> step1 = versions.Version(1);
  ASSERT_TRUE(step1.ok()) << step1.status();

  std::unique_ptr<GenerationRun> run = Build(next);
  ASSERT_NE(run, nullptr);
  const absl::StatusOr<RestoredState> restored = restorer_.Restore(next, run.get(), source.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 1);
  EXPECT_EQ(restored->bytes, 0u);  // copied in memory, nothing received
  EXPECT_TRUE(SameParams(std::as_const(*run->session), step1->params));
  EXPECT_FALSE(
      SameParams(std::as_const(*run->session), std::as_const(*source->session).model().params()));
}

TEST_F(StateRestorerTest, APeerPlanWithoutTheSourcesStateFailsTheTransfer) {
  const Assignment next = FromPeer(testing::EngineJobSpec(8), 3);
  std::unique_ptr<GenerationRun> run = Build(next);
  ASSERT_NE(run, nullptr);
  // This worker was to serve step 3 and holds nothing of generation 1.
  EXPECT_FALSE(restorer_.Restore(next, run.get(), nullptr).ok());
}

TEST_F(StateRestorerTest, AMissingResumeFromJobCheckpointIsAFailedPrecondition) {
  v1::JobSpec spec = testing::EngineJobSpec(8);
  spec.mutable_checkpoint()->set_resume_from_job("older-job");
  const absl::StatusOr<RestoredState> restored = RestoreFresh(spec);
  EXPECT_TRUE(absl::IsFailedPrecondition(restored.status())) << restored.status();
  EXPECT_THAT(restored.status().message(), HasSubstr("checkpoint.resume_from_job"));
}

TEST_F(StateRestorerTest, AnInitFromFileThatCannotBeReadIsAFailedPrecondition) {
  v1::JobSpec spec = testing::EngineJobSpec(8);
  spec.mutable_checkpoint()->set_init_from(::testing::TempDir() + "/no-such-weights.safetensors");
  const absl::StatusOr<RestoredState> restored = RestoreFresh(spec);
  EXPECT_TRUE(absl::IsFailedPrecondition(restored.status())) << restored.status();
}

TEST_F(StateRestorerTest, AnUnreachableCheckpointServiceKeepsItsCodeAndSaysWhatWasSought) {
  options_.checkpoint_factory = [] {
    return std::make_unique<FailingManifests>(absl::UnavailableError("coordinator gone"));
  };
  const absl::StatusOr<RestoredState> restored = RestoreFresh(testing::EngineJobSpec(8));
  EXPECT_TRUE(absl::IsUnavailable(restored.status())) << restored.status();
  EXPECT_THAT(restored.status().message(), HasSubstr("looking for a checkpoint to resume from"));
  EXPECT_THAT(restored.status().message(), HasSubstr("coordinator gone"));
}

}  // namespace
}  // namespace cohort::worker
