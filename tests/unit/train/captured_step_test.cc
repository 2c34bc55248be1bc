// The device-resident step with each micro-batch's forward and backward
// captured and replayed (GptModel::TrainMicroBatch through
// compute::CaptureCache; the CUDA graphs of --cuda_graphs), run on
// GuardedBackend, which records a capture's ops and replays them on the
// memory's contents at replay time as a CUDA graph does. A replay gives the
// bits of the same ops issued one by one only if everything that varies
// between micro-batches and steps (the tokens, the weights, the learning
// rate, the loss sums' places) is read at replay time from the buffers the
// capture baked in; these tests compare bit for bit with the same steps
// issued directly (--cuda_graphs=off), with no tolerance.

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/device_resident_steps.h"
#include "tests/testing/guarded_backend.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

using testing::SameBits;

// Three captures per session (each micro-batch writes its own loss sum).
TrainingConfig Config(int steps) { return testing::DeviceResidentConfig(steps); }

struct SessionRun {
  std::shared_ptr<testing::GuardedBackend> backend = std::make_shared<testing::GuardedBackend>();
  std::unique_ptr<TrainingSession> session;

  SessionRun(const TrainingConfig& config, compute::CudaGraphs graphs) {
    TrainingSessionOptions options;
    options.num_threads = 1;
    options.backend = backend;
    options.cuda_graphs = graphs;
    absl::StatusOr<std::unique_ptr<TrainingSession>> created =
        TrainingSession::Create(config, model::ModelLayout{}, {}, options);
    CHECK(created.ok()) << created.status();
    session = *std::move(created);
    CHECK(session->runner().device_resident());
  }
  const compute::CaptureCache& graphs() const { return *session->runner().micro_batch_graphs(); }
  size_t n() const { return session->model().num_params(); }
  std::vector<float> Params() const {
    const float* p = std::as_const(*session).model().params();
    return std::vector<float>(p, p + n());
  }
  std::vector<float> M() const {
    const float* m = std::as_const(*session).runner().adam_m();
    return std::vector<float>(m, m + n());
  }
  std::vector<float> V() const {
    const float* v = std::as_const(*session).runner().adam_v();
    return std::vector<float>(v, v + n());
  }
  void Restore(const std::vector<float>& params, const std::vector<float>& m,
               const std::vector<float>& v, int64_t step) {
    std::memcpy(session->model().params(), params.data(), params.size() * sizeof(float));
    std::memcpy(session->runner().adam_m(), m.data(), m.size() * sizeof(float));
    std::memcpy(session->runner().adam_v(), v.data(), v.size() * sizeof(float));
    session->runner().versions().SetCurrent(step);
  }
};

void ExpectSameStep(const absl::StatusOr<StepResult>& a, const absl::StatusOr<StepResult>& b,
                    int64_t step) {
  testing::ExpectSameStep(a, b, step);
  if (a.ok() && b.ok()) {
    EXPECT_EQ(a->learning_rate, b->learning_rate);
  }
}

void ExpectSameState(const SessionRun& a, const SessionRun& b) {
  const size_t bytes = a.n() * sizeof(float);
  EXPECT_TRUE(SameBits(a.Params().data(), b.Params().data(), bytes)) << "weights";
  EXPECT_TRUE(SameBits(a.M().data(), b.M().data(), bytes)) << "first moments";
  EXPECT_TRUE(SameBits(a.V().data(), b.V().data(), bytes)) << "second moments";
}

TEST(CapturedStepTest, ReplayedMicroBatchesGiveTheBitsOfDirectOnes) {
  const TrainingConfig config = Config(5);
  SessionRun captured(config, compute::CudaGraphs::kAuto);
  SessionRun direct(config, compute::CudaGraphs::kOff);
  ASSERT_TRUE(captured.graphs().active());
  ASSERT_FALSE(direct.graphs().active());
  const size_t micro_batches = static_cast<size_t>(config.micro_batches_per_step());
  for (int64_t step = 0; step < config.steps; ++step) {
    const size_t waits = captured.backend->synchronizations();
    ExpectSameStep(captured.session->RunStep(Step(step)), direct.session->RunStep(Step(step)),
                   step);
    // Capturing adds no wait to the step's one (a Synchronize in a capture
    // would have failed it).
    if (step > 0) {
      EXPECT_EQ(captured.backend->synchronizations() - waits, 1u) << "step " << step;
    }
  }
  // Step 0 warms each micro-batch's unit up, step 1 captures and replays
  // it, the later steps replay.
  EXPECT_EQ(captured.graphs().captures(), micro_batches);
  EXPECT_EQ(captured.graphs().failed_captures(), 0u);
  EXPECT_EQ(captured.graphs().replays(), micro_batches * (config.steps - 1));
  EXPECT_EQ(captured.backend->replays(), captured.graphs().replays());
  EXPECT_EQ(direct.backend->captures(), 0u);
  EXPECT_EQ(captured.backend->stale_weight_reads(), 0u);
  ExpectSameState(captured, direct);
}

TEST(CapturedStepTest, AStateRestoredUnderLiveCapturesIsWhatTheReplaysRead) {
  // A restore writes the weights and moments from the host into the same
  // buffers: the captures stay valid and their replays must read the
  // restored values (uploaded before the replay, never baked in).
  const TrainingConfig config = Config(6);
  SessionRun captured(config, compute::CudaGraphs::kAuto);
  SessionRun direct(config, compute::CudaGraphs::kOff);
  std::vector<float> params, m, v;
  for (int64_t step = 0; step < 4; ++step) {
    ExpectSameStep(captured.session->RunStep(Step(step)), direct.session->RunStep(Step(step)),
                   step);
    if (step == 1) {  // the state after step 1, as a checkpoint reads it
      params = direct.Params();
      m = direct.M();
      v = direct.V();
    }
  }
  const size_t replays = captured.graphs().replays();
  ASSERT_GT(replays, 0u);
  captured.Restore(params, m, v, 2);
  direct.Restore(params, m, v, 2);
  for (int64_t step = 2; step < config.steps; ++step) {
    ExpectSameStep(captured.session->RunStep(Step(step)), direct.session->RunStep(Step(step)),
                   step);
  }
  // Replayed after the restore, not captured again.
  EXPECT_GT(captured.graphs().replays(), replays);
  EXPECT_EQ(captured.graphs().captures(), static_cast<size_t>(config.micro_batches_per_step()));
  ExpectSameState(captured, direct);
}

TEST(CapturedStepTest, AnUncapturableOpFallsBackToDirectOpsWithTheSameBits) {
  // An op a GPU cannot record (here attention, as a library call that
  // synchronises would be) fails each capture: the step runs those ops
  // directly, once logged, and still matches.
  const TrainingConfig config = Config(4);
  SessionRun captured(config, compute::CudaGraphs::kAuto);
  captured.backend->set_uncapturable_op("AttentionForward");
  SessionRun direct(config, compute::CudaGraphs::kOff);
  for (int64_t step = 0; step < config.steps; ++step) {
    ExpectSameStep(captured.session->RunStep(Step(step)), direct.session->RunStep(Step(step)),
                   step);
  }
  // Each micro-batch's unit tried once, at step 1, and then ran directly.
  EXPECT_EQ(captured.graphs().failed_captures(),
            static_cast<size_t>(config.micro_batches_per_step()));
  EXPECT_EQ(captured.graphs().captures(), 0u);
  EXPECT_EQ(captured.graphs().replays(), 0u);
  EXPECT_EQ(captured.backend->replays(), 0u);
  ExpectSameState(captured, direct);
}

}  // namespace
}  // namespace cohort::train
