// GenerationRun (worker/engine/generation_run.h): one generation's training
// thread on a real session of the small job, built by SessionBuilder, timed
// by a FakeClock. What it reports per step, how each way the loop ends
// becomes a callback (or none), and that its times are its clock's.

#include "worker/engine/generation_run.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/engine_runs.h"
#include "tests/testing/thread_comms.h"
#include "worker/engine/session_builder.h"

namespace cohort::worker {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr absl::Duration kWait = absl::Seconds(60);

class GenerationRunTest : public ::testing::Test {
 protected:
  GenerationRunTest() : options_(testing::OfflineEngineOptions(&clock_)) {
    options_.comms_factory = mesh_.Factory();
  }

  // Member `rank` of `mesh` at `generation`, built and started fresh (as
  // StateRestorer does without a checkpoint).
  std::unique_ptr<GenerationRun> FreshRun(const v1::JobSpec& spec, uint64_t generation,
                                          const v1::Mesh& mesh, int rank) {
    absl::StatusOr<std::unique_ptr<GenerationRun>> run = builder_.Build(
        testing::EngineMember(spec, generation, mesh, rank), nullptr, nullptr, nullptr);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return nullptr;
    (*run)->session->InitializeParameters();
    (*run)->session->runner().versions().SetCurrent(0);
    return *std::move(run);
  }

  // Callbacks that record what they are told.
  GenerationRunCallbacks Recording() {
    GenerationRunCallbacks callbacks;
    callbacks.on_step = [this](const StepReport& report) {
      absl::MutexLock lock(&mu_);
      reports_.push_back(report);
    };
    callbacks.on_first_step = [this](const JobId&, Generation generation) {
      absl::MutexLock lock(&mu_);
      first_steps_.push_back({generation.value(), reports_.size()});
    };
    callbacks.on_finished = [this](const JobId&, Generation, const absl::Status& status) {
      absl::MutexLock lock(&mu_);
      finished_.push_back(status);
    };
    callbacks.on_suspended = [this](const JobId&, Generation,
                                    const std::vector<v1::HeldState>& held,
                                    const absl::Status& status) {
      absl::MutexLock lock(&mu_);
      for (const v1::HeldState& h : held) suspended_held_.push_back({h.generation(), h.step()});
      suspended_.push_back(status);
    };
    return callbacks;
  }

  // Waits until the run has ended with a callback.
  bool WaitForEnd() {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !finished_.empty() || !suspended_.empty();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&ended), kWait);
  }
  // Waits until the run has reported its first step.
  bool WaitForFirstStep() {
    absl::MutexLock lock(&mu_);
    auto started = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !first_steps_.empty(); };
    return mu_.AwaitWithTimeout(absl::Condition(&started), kWait);
  }

  FakeClock clock_;
  testing::ThreadMesh mesh_;
  EngineTrainerOptions options_;
  // Reads options_ as the test left them; outlives the runs (their
  // communicators count into it).
  SessionBuilder builder_{options_, nullptr, nullptr};
  absl::Mutex mu_;
  std::vector<StepReport> reports_ ABSL_GUARDED_BY(mu_);
  // (generation, steps reported before it) of each on_first_step.
  std::vector<std::pair<uint64_t, size_t>> first_steps_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> finished_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> suspended_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, int64_t>> suspended_held_ ABSL_GUARDED_BY(mu_);
};

TEST_F(GenerationRunTest, ACompletedRunReportsEveryStepItsFirstOnceAndFinishesOk) {
  std::unique_ptr<GenerationRun> run =
      FreshRun(testing::EngineJobSpec(4), 2, testing::EngineMesh(1), 0);
  ASSERT_NE(run, nullptr);
  run->Start(&clock_, Recording());
  ASSERT_TRUE(WaitForEnd());
  run->Halt(absl::AbortedError("test over"));
  absl::MutexLock lock(&mu_);
  EXPECT_THAT(finished_, ElementsAre(absl::OkStatus()));
  EXPECT_TRUE(suspended_.empty());
  std::vector<int64_t> steps;
  for (const StepReport& r : reports_) steps.push_back(r.step.value());
  EXPECT_THAT(steps, ElementsAre(1, 2, 3, 4));
  // Once, after the first step's progress was reported.
  EXPECT_THAT(first_steps_, ElementsAre(Pair(2u, 1u)));
  EXPECT_TRUE(run->trained);
  for (const StepReport& r : reports_) {
    EXPECT_GT(r.loss, 0);
    EXPECT_GT(r.tokens_per_second_average, 0);
  }
}

TEST_F(GenerationRunTest, ItsTimesAreItsClocks) {
  options_.loss_log = ::testing::TempDir() + "/generation_run_loss.log";
  std::remove(options_.loss_log.c_str());
  std::unique_ptr<GenerationRun> run =
      FreshRun(testing::EngineJobSpec(2), 3, testing::EngineMesh(1), 0);
  ASSERT_NE(run, nullptr);
  run->LogResume(clock_);
  run->Start(&clock_, Recording());
  ASSERT_TRUE(WaitForEnd());
  run.reset();  // closes the loss log
  {
    // The clock stood still: every step took no time by it (the loop's
    // floor of a nanosecond, so that rates stay finite).
    absl::MutexLock lock(&mu_);
    ASSERT_EQ(reports_.size(), 2u);
    for (const StepReport& r : reports_) EXPECT_EQ(r.step_time_seconds, 1e-9);
  }
  std::ifstream lines(options_.loss_log);
  std::vector<std::string> logged;
  for (std::string line; std::getline(lines, line);) logged.push_back(line);
  ASSERT_EQ(logged.size(), 3u);
  EXPECT_EQ(logged[0], "job engine-1 generation 3 resume 0 time 1700000000.000000");
  for (const std::string& line : logged) {
    EXPECT_THAT(line, HasSubstr(" time 1700000000.000000"));
  }
}

TEST_F(GenerationRunTest, HaltEndsTheRunBetweenStepsWithoutACallback) {
  std::unique_ptr<GenerationRun> run =
      FreshRun(testing::EngineJobSpec(100000), 2, testing::EngineMesh(1), 0);
  ASSERT_NE(run, nullptr);
  run->Start(&clock_, Recording());
  ASSERT_TRUE(WaitForFirstStep());
  run->Halt(absl::AbortedError("suspended"));
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(finished_.empty());
  EXPECT_TRUE(suspended_.empty());
  EXPECT_LT(reports_.size(), 100000u);
  EXPECT_TRUE(run->stop);
}

TEST_F(GenerationRunTest, APeerLostBeforeTheFirstStepReportsTheStateItKeptToo) {
  // Rank 1 of the mesh never comes: the first step's collective gives up.
  options_.collective_timeout = absl::Milliseconds(300);
  std::unique_ptr<GenerationRun> run =
      FreshRun(testing::EngineJobSpec(10), 2, testing::EngineMesh(2), 0);
  ASSERT_NE(run, nullptr);
  run->kept = {HeldAt(Generation(1), 7)};  // the source generation's, still held
  run->Start(&clock_, Recording());
  ASSERT_TRUE(WaitForEnd());
  run->Halt(absl::AbortedError("test over"));
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(finished_.empty());
  ASSERT_EQ(suspended_.size(), 1u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(suspended_[0])) << suspended_[0];
  EXPECT_FALSE(run->trained);
  EXPECT_THAT(suspended_held_, Contains(Pair(1u, 7)));
  EXPECT_THAT(suspended_held_, Contains(Pair(2u, 0)));
}

}  // namespace
}  // namespace cohort::worker
