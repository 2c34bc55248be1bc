// An interrupt (a Suspend or Stop as it arrives) must reach the Prepare it
// is meant for even when it arrives before that Prepare begins (issue 22):
// the agent queues the Assign and runs Prepare on its command thread, while
// the Suspend that follows is seen at once on the reader thread. Prepare
// used to clear the interrupt as it began, and then waited for peers that
// had already suspended until its bootstrap deadline.

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_specs.h"
#include "tests/testing/paths.h"
#include "worker/comm/file_kv_client.h"
#include "worker/engine/engine_trainer.h"
#include "worker/train/mesh_communicators.h"

namespace cohort::worker {
namespace {

using testing::kSmallJobMicroBatches;  // the meshes below are planned for SmallJobSpec

class EngineTrainerInterruptTest : public ::testing::Test {
 protected:
  EngineTrainerInterruptTest() {
    EngineTrainerOptions options;
    options.num_threads = 1;
    // Rank 1 of the two-rank mesh never starts: a Prepare that is not
    // interrupted waits this long for its address.
    options.bootstrap_timeout = absl::Seconds(2);
    options.kv_factory = [dir = testing::MakeTempDir("interrupt-kv")](const comm::KvScopeRef&) {
      absl::StatusOr<std::unique_ptr<comm::FileKvClient>> kv = comm::FileKvClient::Create(dir);
      CHECK(kv.ok()) << kv.status();
      return std::unique_ptr<comm::KvClient>(*std::move(kv));
    };
    trainer_ = std::make_unique<EngineTrainer>(std::move(options));
  }

  // Rank 0 of a fresh two-rank job at `generation`.
  static Assignment TwoRanks(uint64_t generation) {
    Assignment a;
    a.job_id = JobId("interrupted");
    a.generation = Generation(generation);
    a.spec = testing::SmallJobSpec("interrupted", 1, 2, 2);
    a.mesh = train::LocalMesh(2, 1, 1, kSmallJobMicroBatches);
    a.coordinates = a.mesh.members(0).coordinates();
    a.recovery.set_kind(v1::RECOVERY_KIND_NONE);
    return a;
  }

  std::unique_ptr<EngineTrainer> trainer_;
};

TEST_F(EngineTrainerInterruptTest, AnInterruptThatArrivesBeforePrepareBeginsCancelsIt) {
  trainer_->Interrupt(JobId("interrupted"), Generation(3));
  const absl::Time start = absl::Now();
  const absl::Status prepared = trainer_->Prepare(TwoRanks(3));
  EXPECT_TRUE(absl::IsCancelled(prepared)) << prepared;
  // Cancelled at once, not after the 2 s bootstrap deadline.
  EXPECT_LT(absl::Now() - start, absl::Seconds(1.5)) << prepared;
}

TEST_F(EngineTrainerInterruptTest, AnInterruptOfAnOlderGenerationOrAnotherJobDoesNot) {
  trainer_->Interrupt(JobId("interrupted"), Generation(2));
  trainer_->Interrupt(JobId("another-job"), Generation(9));
  const absl::Status prepared = trainer_->Prepare(TwoRanks(3));
  EXPECT_TRUE(absl::IsDeadlineExceeded(prepared)) << prepared;
  // Kept for the generation it named: a later Prepare of it still gives up.
  trainer_->Interrupt(JobId("interrupted"), Generation(4));
  EXPECT_TRUE(absl::IsCancelled(trainer_->Prepare(TwoRanks(4))));
  EXPECT_TRUE(absl::IsDeadlineExceeded(trainer_->Prepare(TwoRanks(5))));
}

}  // namespace
}  // namespace cohort::worker
