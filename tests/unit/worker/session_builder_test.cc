// SessionBuilder (worker/engine/session_builder.h) on the small job: what
// it asks the communicators' factory for, which session a generation gets
// (new, kept, a warm spare's), when a session fits another place, and the
// warm spare's memory bound. In-process communicators, a FakeClock.

#include "worker/engine/session_builder.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/engine_runs.h"
#include "tests/testing/thread_comms.h"

namespace cohort::worker {
namespace {

using ::testing::HasSubstr;

class SessionBuilderTest : public ::testing::Test {
 protected:
  SessionBuilderTest() : options_(testing::OfflineEngineOptions(&clock_)) {
    options_.comms_factory = [this](const CommsRequest& request) {
      requests_.push_back(request);
      return mesh_.Factory()(request);
    };
  }

  std::unique_ptr<GenerationRun> Build(const Assignment& assignment, GenerationRun* keep = nullptr,
                                       GenerationRun* warm = nullptr) {
    absl::StatusOr<std::unique_ptr<GenerationRun>> run =
        builder_.Build(assignment, keep, warm, nullptr);
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? *std::move(run) : nullptr;
  }

  FakeClock clock_;
  testing::ThreadMesh mesh_;
  std::vector<CommsRequest> requests_;
  EngineTrainerOptions options_;
  InterruptGate interrupts_;
  SessionBuilder builder_{options_, &interrupts_, nullptr};
};

TEST_F(SessionBuilderTest, ASoloMemberGetsASessionAndNoCommunicators) {
  const v1::JobSpec spec = testing::EngineJobSpec(12);
  std::unique_ptr<GenerationRun> run =
      Build(testing::EngineMember(spec, 1, testing::EngineMesh(1), 0));
  ASSERT_NE(run, nullptr);
  EXPECT_TRUE(requests_.empty());
  EXPECT_EQ(run->comms, nullptr);
  ASSERT_NE(run->session, nullptr);
  EXPECT_NE(run->checkpoints, nullptr);
  EXPECT_EQ(run->steps, 12);
  EXPECT_EQ(run->generation, Generation(1));
  EXPECT_TRUE(run->keep_previous);  // the job may grow to 3 workers
  // Timed by the clock, which stood still.
  EXPECT_EQ(run->communicators_seconds, 0);
}

TEST_F(SessionBuilderTest, TheFactoryIsAskedForEveryParticipantOfAPeerRecovery) {
  const v1::JobSpec spec = testing::EngineJobSpec(12);
  Assignment member =
      testing::EngineMember(spec, 2, testing::EngineMesh(2), 1, v1::RECOVERY_KIND_PEER);
  member.recovery.add_donors()->set_worker_id("donor");
  std::unique_ptr<GenerationRun> run = Build(member);
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(requests_.size(), 1u);
  const CommsRequest& request = requests_[0];
  EXPECT_EQ(request.participant, 1);
  EXPECT_EQ(request.participants, 3);  // two members and the donor
  EXPECT_TRUE(request.mesh_groups);
  EXPECT_TRUE(request.world);
  EXPECT_EQ(request.cancelled, interrupts_.cancelled_flag());
  EXPECT_EQ(request.clock, &clock_);
  // The session trains over the data group, counted.
  EXPECT_NE(run->tracked_data, nullptr);
  EXPECT_EQ(run->tracked_tensor, nullptr);
  EXPECT_FALSE(builder_.in_collective());

  // A donor gets the world to serve over, and no session.
  Assignment donor = member;
  donor.donor = true;
  donor.participant = 2;
  std::unique_ptr<GenerationRun> served = Build(donor);
  ASSERT_NE(served, nullptr);
  ASSERT_EQ(requests_.size(), 2u);
  EXPECT_FALSE(requests_[1].mesh_groups);
  EXPECT_TRUE(requests_[1].world);
  EXPECT_EQ(served->session, nullptr);
}

TEST_F(SessionBuilderTest, AKeptSessionMovesToTheNewGenerationAndRemembersTheOldOne) {
  const v1::JobSpec spec = testing::EngineJobSpec(12);
  std::unique_ptr<GenerationRun> first =
      Build(testing::EngineMember(spec, 1, testing::EngineMesh(1), 0));
  ASSERT_NE(first, nullptr);
  const train::TrainingSession* session = first->session.get();
  const Assignment next =
      testing::EngineMember(spec, 2, testing::EngineMesh(1), 0, v1::RECOVERY_KIND_PEER);
  ASSERT_TRUE(SessionBuilder::CanKeepSession(*first, next));
  std::unique_ptr<GenerationRun> second = Build(next, first.get());
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->session.get(), session);
  EXPECT_EQ(first->session, nullptr);
  EXPECT_EQ(second->also_holds, std::vector<Generation>({Generation(1)}));
  EXPECT_FALSE(second->from_warm);

  // Kept again before it trained: it holds both older generations' state.
  std::unique_ptr<GenerationRun> third =
      Build(testing::EngineMember(spec, 3, testing::EngineMesh(1), 0, v1::RECOVERY_KIND_PEER),
            second.get());
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->also_holds, std::vector<Generation>({Generation(1), Generation(2)}));
}

TEST_F(SessionBuilderTest, ASessionFitsOnlyTheSamePlaceOfTheSameTraining) {
  const v1::JobSpec spec = testing::EngineJobSpec(12);
  const v1::Mesh two = testing::EngineMesh(2);
  std::unique_ptr<GenerationRun> rank0 = Build(testing::EngineMember(spec, 1, two, 0));
  ASSERT_NE(rank0, nullptr);
  const Assignment same = testing::EngineMember(spec, 2, two, 0);
  EXPECT_TRUE(SessionBuilder::CanKeepSession(*rank0, same));
  EXPECT_TRUE(SessionBuilder::SamePlace(testing::EngineMember(spec, 1, two, 0), same));
  // Other elastic bounds: the session does not depend on them.
  v1::JobSpec wider = spec;
  wider.mutable_elastic()->set_max_workers(5);
  EXPECT_TRUE(SessionBuilder::CanKeepSession(*rank0, testing::EngineMember(wider, 2, two, 0)));

  const Assignment other_rank = testing::EngineMember(spec, 2, two, 1);
  EXPECT_FALSE(SessionBuilder::CanKeepSession(*rank0, other_rank));
  EXPECT_FALSE(SessionBuilder::SamePlace(same, other_rank));
  // ...but its model shard may serve a session of that place.
  EXPECT_TRUE(SessionBuilder::CanReuseSession(*rank0, other_rank));
  EXPECT_FALSE(SessionBuilder::CanKeepSession(
      *rank0, testing::EngineMember(spec, 2, testing::EngineMesh(1), 0)));
  v1::JobSpec longer = spec;
  longer.set_steps(13);
  EXPECT_FALSE(SessionBuilder::CanKeepSession(*rank0, testing::EngineMember(longer, 2, two, 0)));
  Assignment donor = same;
  donor.donor = true;
  EXPECT_FALSE(SessionBuilder::CanKeepSession(*rank0, donor));
  EXPECT_FALSE(SessionBuilder::CanReuseSession(*rank0, donor));
  Assignment other_job = same;
  other_job.job_id = JobId("other-1");
  EXPECT_FALSE(SessionBuilder::CanKeepSession(*rank0, other_job));
  EXPECT_FALSE(SessionBuilder::CanReuseSession(*rank0, other_job));
}

TEST_F(SessionBuilderTest, AWarmSessionIsBoundedDetachedAndTakenByItsPlace) {
  const v1::JobSpec spec = testing::EngineJobSpec(12);
  const v1::Mesh two = testing::EngineMesh(2);
  const Assignment slot = testing::EngineMember(spec, 1, two, 1);
  options_.warm_memory_bytes = 1 << 20;
  const absl::StatusOr<std::unique_ptr<GenerationRun>> refused = builder_.BuildWarm(slot);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("--warm_spare_memory"));

  options_.warm_memory_bytes = uint64_t{1} << 30;
  absl::StatusOr<std::unique_ptr<GenerationRun>> warm = builder_.BuildWarm(slot);
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_GT((*warm)->warm_bytes, 0u);
  EXPECT_LT((*warm)->warm_bytes, options_.warm_memory_bytes);
  EXPECT_TRUE(requests_.empty()) << "a warm spare's communicators belong to no generation";
  comm::Communicator* detached = (*warm)->comms->groups().data;
  ASSERT_NE(detached, nullptr);
  EXPECT_EQ(detached->rank(), 1);
  EXPECT_EQ(detached->size(), 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(detached->Barrier(absl::Seconds(1))));

  const train::TrainingSession* session = (*warm)->session.get();
  std::unique_ptr<GenerationRun> taken =
      Build(testing::EngineMember(spec, 2, two, 1), nullptr, warm->get());
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(taken->session.get(), session);
  EXPECT_TRUE(taken->from_warm);
  EXPECT_TRUE(taken->also_holds.empty());
  ASSERT_EQ(requests_.size(), 1u);  // its own generation's communicators
}

}  // namespace
}  // namespace cohort::worker
