// RunTrainingLoop (worker/engine/training_loop.h) on a real TrainingSession over fake
// communicators: where it starts and ends, what it reports per step, when it
// checkpoints, and how each way a step can fail ends the loop.

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/layout/mesh_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_checkpoint_client.h"
#include "tests/testing/guarded_backend.h"
#include "tests/testing/job_specs.h"
#include "worker/comm/communicator.h"
#include "worker/engine/training_loop.h"
#include "worker/train/training_config.h"

namespace cohort::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A data-parallel group of two in which the peer contributes what this rank
// does, until `fail` is set: then every collective returns `failure`.
class FakeGroup : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp op,
                         absl::Duration) override {
    if (op == comm::ReduceOp::kSum && type == comm::DataType::kFloat32) {
      float* f = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) f[i] *= 2;
    }
    return Outcome();
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank,
                             comm::DataType type, comm::ReduceOp, absl::Duration) override {
    std::memcpy(output, input, count_per_rank * comm::DataTypeSize(type));
    return Outcome();
  }
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank,
                         comm::DataType type, absl::Duration) override {
    const size_t bytes = count_per_rank * comm::DataTypeSize(type);
    for (int r = 0; r < 2; ++r) std::memcpy(static_cast<char*>(output) + r * bytes, input, bytes);
    return Outcome();
  }
  absl::Status Broadcast(void*, size_t, comm::DataType, int, absl::Duration) override {
    return Outcome();
  }
  absl::Status Send(const void*, size_t, int, uint32_t, absl::Duration) override {
    return Outcome();
  }
  absl::Status Recv(void*, size_t, int, uint32_t, absl::Duration) override { return Outcome(); }
  absl::Status SendRecv(const void*, size_t, int, void*, size_t, int, uint32_t,
                        absl::Duration) override {
    return Outcome();
  }
  absl::Status Barrier(absl::Duration) override { return Outcome(); }
  void Abort(const absl::Status&) override {}

  std::atomic<bool> fail{false};
  absl::Status failure = absl::UnavailableError("peer 1 is gone");

 private:
  absl::Status Outcome() const { return fail ? failure : absl::OkStatus(); }
};

class TrainingLoopTest : public ::testing::Test {
 protected:
  // A session of the small test model; data parallel over `group` when set.
  std::unique_ptr<train::TrainingSession> NewSession(int64_t steps, FakeGroup* group = nullptr,
                                                     int validation_interval = -1) {
    v1::JobSpec spec = testing::SmallJobSpec("loop", 1, 1, 2);
    spec.set_steps(steps);
    if (validation_interval >= 0) {
      spec.mutable_data()->mutable_validation()->set_held_out_fraction(0.1);
      spec.mutable_data()->mutable_validation()->set_interval_steps(validation_interval);
      spec.mutable_data()->mutable_validation()->set_batches(1);
    }
    absl::StatusOr<train::TrainingConfig> config =
        train::TrainingConfigFromSpec(
            spec, group == nullptr ? std::vector<int>{}
                                   : layout::MicroBatchShares(testing::kSmallJobMicroBatches, 2));
    EXPECT_TRUE(config.ok()) << config.status();
    train::TrainingGroups groups;
    groups.data = group;
    train::TrainingSessionOptions options;
    options.num_threads = 1;
    absl::StatusOr<std::unique_ptr<train::TrainingSession>> session =
        train::TrainingSession::Create(*config, model::ModelLayout{}, groups, options);
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *std::move(session) : nullptr;
  }

  TrainingLoopInput Input(train::TrainingSession* session, int64_t start, int64_t steps) {
    TrainingLoopInput input;
    input.job = JobId("loop-1");
    input.generation = Generation(3);
    input.session = session;
    input.start_step = start;
    input.steps = steps;
    input.optimizer = {session->data_parallel().update_begin(),
                       session->data_parallel().update_end()};
    input.stop = &stop_;
    return input;
  }

  // Records each on_step; `then` runs after recording.
  TrainingLoopHooks Recording(std::function<void(Step)> then = nullptr) {
    TrainingLoopHooks hooks;
    hooks.on_step = [this, then](Step done, const train::StepResult& result, absl::Duration took) {
      steps_.push_back(done.value());
      losses_.push_back(result.loss);
      EXPECT_GT(took, absl::ZeroDuration());
      if (then) then(done);
    };
    return hooks;
  }

  std::atomic<bool> stop_{false};
  std::vector<int64_t> steps_;
  std::vector<double> losses_;
};

TEST_F(TrainingLoopTest, ARunResumedAtAStepContinuesTheTrajectoryOfOneUninterruptedRun) {
  // The reference: steps 0..5 in one loop.
  std::unique_ptr<train::TrainingSession> reference = NewSession(6);
  ASSERT_NE(reference, nullptr);
  TrainingLoopOutcome whole = RunTrainingLoop(Input(reference.get(), 0, 6), Recording());
  EXPECT_EQ(whole.end, TrainingLoopEnd::kCompleted);
  EXPECT_EQ(whole.steps_done, 6);
  const std::vector<double> reference_losses = losses_;
  EXPECT_THAT(steps_, ElementsAre(1, 2, 3, 4, 5, 6));

  // The same in two calls, the second resuming at step 3 (as after a
  // Prepare whose restore returned 3), with a loss log.
  steps_.clear();
  losses_.clear();
  const std::string log_path = ::testing::TempDir() + "/training_loop_loss.log";
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  ASSERT_NE(log, nullptr);
  std::unique_ptr<train::TrainingSession> session = NewSession(6);
  TrainingLoopInput first = Input(session.get(), 0, 3);
  EXPECT_EQ(RunTrainingLoop(first, Recording()).end, TrainingLoopEnd::kCompleted);
  TrainingLoopInput second = Input(session.get(), 3, 6);
  second.loss_log = log;
  const TrainingLoopOutcome resumed = RunTrainingLoop(second, Recording());
  std::fclose(log);
  EXPECT_EQ(resumed.end, TrainingLoopEnd::kCompleted);
  EXPECT_EQ(resumed.steps_done, 3);
  EXPECT_THAT(steps_, ElementsAre(1, 2, 3, 4, 5, 6));
  ASSERT_EQ(losses_.size(), reference_losses.size());
  for (size_t i = 0; i < losses_.size(); ++i) {
    EXPECT_EQ(losses_[i], reference_losses[i]) << "step " << i + 1;  // bitwise: same math
  }
  std::ifstream lines(log_path);
  std::string line;
  std::vector<std::string> logged;
  while (std::getline(lines, line)) logged.push_back(line);
  ASSERT_EQ(logged.size(), 3u);
  EXPECT_THAT(logged[0], HasSubstr("job loop-1 generation 3 step 4 loss "));
  EXPECT_THAT(logged[2], HasSubstr(" step 6 loss "));
}

TEST_F(TrainingLoopTest, ACheckpointFollowsEveryIntervalAndTheLastStep) {
  std::unique_ptr<train::TrainingSession> session = NewSession(5);
  ASSERT_NE(session, nullptr);
  testing::RecordingCheckpointClient client;
  checkpoint::CheckpointWriterOptions options;
  options.job_id = "loop-1";
  options.generation = Generation(3);
  options.position = {};
  checkpoint::CheckpointWriter writer(&client, session->config().model, session->model().table(),
                                      options);
  TrainingLoopInput input = Input(session.get(), 0, 5);
  input.writer = &writer;
  input.checkpoint_interval = 2;
  TrainingLoopHooks hooks = Recording();
  int checkpoints = 0;
  hooks.on_checkpoint = [&checkpoints](absl::Duration stall) {
    EXPECT_GE(stall, absl::ZeroDuration());
    ++checkpoints;
  };
  const TrainingLoopOutcome outcome = RunTrainingLoop(input, hooks);
  EXPECT_EQ(outcome.end, TrainingLoopEnd::kCompleted);
  EXPECT_EQ(checkpoints, 3);
  // The loop waits for the last upload before it reports completion.
  EXPECT_THAT(client.steps(), ElementsAre(2, 4, 5));
  EXPECT_EQ(writer.uploads_ok(), 3);
}

TEST_F(TrainingLoopTest, ADeviceResidentSessionUploadsItsDrainedSnapshotWithTheHostPathsBytes) {
  // The same job on the CPU (checkpoints copy the host state) and on a
  // backend of device memory (checkpoints drain a device snapshot beside
  // the next step): the device-resident step's bits are the CPU's, so every
  // checkpoint's bytes must be too, step for step.
  v1::JobSpec spec = testing::SmallJobSpec("loop", 1, 1, 1);
  spec.set_steps(5);
  absl::StatusOr<train::TrainingConfig> config = train::TrainingConfigFromSpec(spec, {});
  ASSERT_TRUE(config.ok()) << config.status();
  auto guarded = std::make_shared<testing::GuardedBackend>();
  std::vector<std::vector<std::string>> uploads;
  for (std::shared_ptr<compute::Backend> backend :
       {std::shared_ptr<compute::Backend>(), std::shared_ptr<compute::Backend>(guarded)}) {
    train::TrainingSessionOptions options;
    options.num_threads = 1;
    options.backend = backend;
    options.checkpoint_snapshot = true;
    absl::StatusOr<std::unique_ptr<train::TrainingSession>> session =
        train::TrainingSession::Create(*config, model::ModelLayout{}, {}, options);
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_EQ((*session)->device_snapshot() != nullptr, backend != nullptr);
    testing::RecordingCheckpointClient client;
    checkpoint::CheckpointWriterOptions writer_options;
    writer_options.job_id = "loop-1";
    writer_options.generation = Generation(3);
    checkpoint::CheckpointWriter writer(&client, (*session)->config().model,
                                        (*session)->model().table(), writer_options);
    TrainingLoopInput input = Input(session->get(), 0, 5);
    input.writer = &writer;
    input.checkpoint_interval = 2;
    EXPECT_EQ(RunTrainingLoop(input, Recording()).end, TrainingLoopEnd::kCompleted);
    EXPECT_THAT(client.steps(), ElementsAre(2, 4, 5));
    EXPECT_EQ(writer.uploads_ok(), 3);
    uploads.push_back(client.payloads());
  }
  EXPECT_EQ(guarded->side_copy_calls(), 3u);
  ASSERT_EQ(uploads[0].size(), 3u);
  ASSERT_EQ(uploads[1].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(uploads[0][i].empty());
    EXPECT_TRUE(uploads[0][i] == uploads[1][i]) << "checkpoint " << i;
  }
}

TEST_F(TrainingLoopTest, ValidationFollowsEveryIntervalTheLastStepAndAResumeWhereOneWasDue) {
  std::unique_ptr<train::TrainingSession> session = NewSession(5, nullptr, 2);
  ASSERT_NE(session, nullptr);
  std::vector<int64_t> validated;
  std::vector<double> losses;
  TrainingLoopHooks hooks = Recording();
  hooks.on_validation = [&](Step done, double loss, absl::Duration) {
    validated.push_back(done.value());
    losses.push_back(loss);
  };
  const std::string log_path = ::testing::TempDir() + "/training_loop_validation.log";
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  ASSERT_NE(log, nullptr);
  TrainingLoopInput input = Input(session.get(), 0, 5);
  input.loss_log = log;
  EXPECT_EQ(RunTrainingLoop(input, hooks).end, TrainingLoopEnd::kCompleted);
  std::fclose(log);
  EXPECT_THAT(validated, ElementsAre(2, 4, 5));
  EXPECT_GT(losses[0], losses[2]) << "the model learns between validations";
  std::ifstream lines(log_path);
  std::string line;
  int validation_lines = 0;
  while (std::getline(lines, line)) {
    validation_lines += line.find("job loop-1 generation 3 validation ") == 0;
  }
  EXPECT_EQ(validation_lines, 3);

  // A generation that resumes at step 4 (where a validation was due)
  // validates first; one at step 3 does not.
  validated.clear();
  std::unique_ptr<train::TrainingSession> resumed = NewSession(5, nullptr, 2);
  EXPECT_EQ(RunTrainingLoop(Input(resumed.get(), 4, 5), hooks).end, TrainingLoopEnd::kCompleted);
  EXPECT_THAT(validated, ElementsAre(4, 5));
  validated.clear();
  EXPECT_EQ(RunTrainingLoop(Input(resumed.get(), 3, 5), hooks).end, TrainingLoopEnd::kCompleted);
  EXPECT_THAT(validated, ElementsAre(4, 5));
}

TEST_F(TrainingLoopTest, AValidationThatLosesAPeerEndsTheLoopWithTheStepsState) {
  FakeGroup group;
  std::unique_ptr<train::TrainingSession> session = NewSession(4, &group, 2);
  ASSERT_NE(session, nullptr);
  TrainingLoopHooks hooks = Recording();
  hooks.on_step = [&](Step done, const train::StepResult&, absl::Duration) {
    if (done == Step(2)) group.fail = true;  // the validation after step 2 fails
  };
  bool validated = false;
  hooks.on_validation = [&](Step, double, absl::Duration) { validated = true; };
  const TrainingLoopOutcome outcome = RunTrainingLoop(Input(session.get(), 0, 4), hooks);
  EXPECT_EQ(outcome.end, TrainingLoopEnd::kPeerLost);
  EXPECT_FALSE(validated);
  EXPECT_EQ(outcome.steps_done, 2);
  EXPECT_EQ(outcome.newest_state, 2) << "the step's state is kept for the next generation";
}

TEST_F(TrainingLoopTest, StopEndsTheLoopBetweenSteps) {
  std::unique_ptr<train::TrainingSession> session = NewSession(10);
  ASSERT_NE(session, nullptr);
  const TrainingLoopOutcome outcome = RunTrainingLoop(
      Input(session.get(), 0, 10), Recording([this](Step done) {
        if (done == Step(2)) stop_ = true;
      }));
  EXPECT_EQ(outcome.end, TrainingLoopEnd::kStopped);
  EXPECT_EQ(outcome.steps_done, 2);
  EXPECT_THAT(steps_, ElementsAre(1, 2));
}

TEST_F(TrainingLoopTest, HowAFailedCollectiveEndsTheLoop) {
  struct Case {
    absl::Status failure;
    TrainingLoopEnd end;
  };
  const std::vector<Case> cases = {
      {absl::UnavailableError("peer 1 is gone"), TrainingLoopEnd::kPeerLost},
      {absl::DeadlineExceededError("peer 1 is silent"), TrainingLoopEnd::kPeerLost},
      {absl::AbortedError("generation released"), TrainingLoopEnd::kStopped},
      {absl::InternalError("a bug"), TrainingLoopEnd::kFailed},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.failure.ToString());
    steps_.clear();
    FakeGroup group;
    group.failure = c.failure;
    std::unique_ptr<train::TrainingSession> session = NewSession(10, &group);
    ASSERT_NE(session, nullptr);
    // Two steps train; the third's collectives fail.
    const TrainingLoopOutcome outcome =
        RunTrainingLoop(Input(session.get(), 0, 10), Recording([&group](Step done) {
                          if (done == Step(2)) group.fail = true;
                        }));
    EXPECT_EQ(outcome.end, c.end);
    EXPECT_EQ(outcome.steps_done, 2);
    if (c.end != TrainingLoopEnd::kStopped) {
      EXPECT_EQ(outcome.status, c.failure);
    }
    if (c.end == TrainingLoopEnd::kPeerLost) {
      // What survivors report holding: the state after the last whole step.
      EXPECT_EQ(outcome.newest_state, 2);
    }
  }
}

}  // namespace
}  // namespace cohort::worker
