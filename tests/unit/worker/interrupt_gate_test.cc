// InterruptGate (worker/engine/interrupt_gate.h): an interrupt reaches the
// Prepare or Donate of the job and generations it names, whether it comes
// before the call begins or while the call runs, and aborts the run that
// call is building; it reaches nothing else.

#include "worker/engine/interrupt_gate.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/engine_runs.h"

namespace cohort::worker {
namespace {

// Communicators that record in `aborts` why they were aborted.
std::unique_ptr<GenerationComms> Recording(std::vector<absl::Status>* aborts) {
  return std::make_unique<testing::AbortRecordingComms>(
      [aborts](const absl::Status& reason) { aborts->push_back(reason); });
}

Assignment Of(const std::string& job, uint64_t generation) {
  Assignment a;
  a.job_id = JobId(job);
  a.generation = Generation(generation);
  return a;
}

TEST(InterruptGateTest, AnInterruptBeforeTheCallBeginsCancelsItAsItBegins) {
  InterruptGate gate;
  gate.Interrupt(JobId("a"), Generation(3));
  gate.Begin(Of("a", 3));
  EXPECT_TRUE(gate.cancelled());
  EXPECT_TRUE(gate.cancelled_flag()->load());
  gate.End();
  // Kept for the generations it named.
  gate.Begin(Of("a", 2));
  EXPECT_TRUE(gate.cancelled());
  gate.End();
}

TEST(InterruptGateTest, AnInterruptOfAnOlderGenerationOrAnotherJobDoesNotCancel) {
  InterruptGate gate;
  gate.Interrupt(JobId("a"), Generation(2));
  gate.Interrupt(JobId("b"), Generation(9));
  gate.Begin(Of("a", 3));
  EXPECT_FALSE(gate.cancelled());
  gate.End();
  // Job b's was dropped when a call of job a began.
  gate.Begin(Of("b", 9));
  EXPECT_FALSE(gate.cancelled());
  gate.End();
}

TEST(InterruptGateTest, AnInterruptDuringTheCallAbortsTheRunItBuilds) {
  InterruptGate gate;
  std::vector<absl::Status> aborts;
  {
    GenerationRun run;
    run.comms = Recording(&aborts);
    gate.Begin(Of("a", 4));
    gate.SetBuilding(&run);
    gate.Interrupt(JobId("a"), Generation(3));  // older: the call goes on
    EXPECT_FALSE(gate.cancelled());
    EXPECT_TRUE(aborts.empty());
    gate.Interrupt(JobId("a"), Generation(4));
    EXPECT_TRUE(gate.cancelled());
    ASSERT_EQ(aborts.size(), 1u);
    EXPECT_TRUE(absl::IsCancelled(aborts[0])) << aborts[0];
    gate.SetBuilding(nullptr);
    gate.End();
    aborts.clear();
  }  // the run's own release aborts it once more
  EXPECT_EQ(aborts.size(), 1u);
}

TEST(InterruptGateTest,
     InterruptAllReachesWhateverIsInFlightAndAnInterruptAfterTheCallOnlyRecords) {
  InterruptGate gate;
  std::vector<absl::Status> aborts;
  GenerationRun run;
  run.comms = Recording(&aborts);
  gate.Begin(Of("a", 1));
  gate.SetBuilding(&run);
  gate.InterruptAll();
  EXPECT_TRUE(gate.cancelled());
  EXPECT_EQ(aborts.size(), 1u);
  gate.SetBuilding(nullptr);
  gate.End();
  // Nothing in flight: recorded for the next call of generation <= 5 only.
  gate.Interrupt(JobId("a"), Generation(5));
  EXPECT_EQ(aborts.size(), 1u);
  gate.Begin(Of("a", 6));
  EXPECT_FALSE(gate.cancelled());
  gate.End();
  run.comms.reset();
}

}  // namespace
}  // namespace cohort::worker
