#pragma once
// The engine's parts (worker/engine/) under test without a coordinator: the
// small test job as the coordinator would assign it, and trainer options
// whose runs need no Checkpoints service (RecordingCheckpointClient: there
// is never a checkpoint to resume from) and no UCX (the caller gives a
// CommsFactory, tests/testing/thread_comms.h, where a mesh has peers).

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cohort/v1/job.pb.h"
#include "common/clock.h"
#include "common/job_spec/validator.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_checkpoint_client.h"
#include "tests/testing/job_specs.h"
#include "worker/agent/trainer.h"
#include "worker/engine/engine_trainer_options.h"
#include "worker/engine/generation_comms.h"
#include "worker/train/mesh_communicators.h"

namespace cohort::testing {

// The small test job (SmallJobSpec) of `steps` steps, ZeRO-1 with `replicas`
// copies of each moment shard, normalized as the coordinator sends it.
inline v1::JobSpec EngineJobSpec(int64_t steps, int replicas = 1) {
  v1::JobSpec spec = SmallJobSpec("engine", 1, 1, 3);
  spec.set_steps(steps);
  spec.mutable_parallelism()->set_zero1(true);
  spec.mutable_elastic()->set_optimizer_replicas(replicas);
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  EXPECT_TRUE(normalized.ok()) << normalized.status();
  return normalized.ok() ? *normalized : spec;
}

// The mesh of `dp` data ranks the small job's micro-batches split over.
inline v1::Mesh EngineMesh(int dp) { return train::LocalMesh(dp, 1, 1, kSmallJobMicroBatches); }

// Member `rank` of `mesh` at `generation` of job "engine-1", restoring by
// `kind` (NONE: a fresh start, or the job's newest checkpoint).
inline worker::Assignment EngineMember(const v1::JobSpec& spec, uint64_t generation,
                                       const v1::Mesh& mesh, int rank,
                                       v1::RecoveryKind kind = v1::RECOVERY_KIND_NONE) {
  worker::Assignment a;
  a.job_id = JobId("engine-1");
  a.generation = Generation(generation);
  a.spec = spec;
  a.mesh = mesh;
  a.coordinates = mesh.members(rank).coordinates();
  a.recovery.set_kind(kind);
  a.participant = rank;
  return a;
}

// One compute thread, a checkpoint client that holds nothing, timed by
// `clock`.
inline worker::EngineTrainerOptions OfflineEngineOptions(const Clock* clock) {
  worker::EngineTrainerOptions options;
  options.num_threads = 1;
  options.collective_timeout = absl::Seconds(20);
  options.checkpoint_factory = [] { return std::make_unique<RecordingCheckpointClient>(); };
  options.clock = clock;
  return options;
}

// Runs `calls` at once, each on its own thread (a generation's participants
// must meet), and returns their statuses.
inline std::vector<absl::Status> Together(std::vector<std::function<absl::Status()>> calls) {
  std::vector<absl::Status> out(calls.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = calls[i](); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// A generation's communicators that only say when they are aborted (an
// interrupt, a run's release): none of them exists.
class AbortRecordingComms : public worker::GenerationComms {
 public:
  explicit AbortRecordingComms(std::function<void(const absl::Status&)> on_abort)
      : on_abort_(std::move(on_abort)) {}
  train::TrainingGroups groups() const override { return {}; }
  comm::Communicator* world() const override { return nullptr; }
  void Abort(const absl::Status& reason) override { on_abort_(reason); }

 private:
  std::function<void(const absl::Status&)> on_abort_;
};

}  // namespace cohort::testing
