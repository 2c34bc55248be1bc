#pragma once
// EngineTrainer: the worker's Trainer that really trains. Prepare builds,
// for the assignment's generation, the communicators (UCX context over the
// whole mesh, bootstrapped through the coordinator's KeyValue service scoped
// to (job, generation); one communicator per mesh axis group in use) and a
// TrainingSession, restores the newest committed checkpoint (the job's own,
// else the one checkpoint.resume_from_job names) re-sharded to this rank's
// layout, then starts a training thread that runs steps until the job's
// step count, reporting progress, and tells the agent when it ends.
//
// Checkpoints. With checkpoint.interval_steps = N > 0, after every N-th step
// and after the last one, the rank snapshots its share of the state and
// uploads it in the background (worker/checkpoint/checkpoint_writer.h); the
// training loop is blocked only for the copy (and for the previous upload,
// if it is still running). The final upload ends before the run reports
// completion.
//
// How a run ends:
//   all steps done              on_finished(OK)         -> COMPLETED
//   a peer died (Unavailable)   nothing: the coordinator notices the death
//                               and sends Reconfigure (a new Prepare) or Stop
//   Stop()/a new Prepare        nothing (Aborted is expected)
//   anything else               on_finished(error)      -> FAILED
//
// Thread-safe, per the Trainer contract: Prepare and Stop from the agent's
// command thread, Stop also from its run thread (possibly during Prepare,
// which then gives up with Cancelled), progress() from any thread.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/registry.h"
#include "worker/checkpoint/checkpoint_client.h"
#include "worker/checkpoint/checkpoint_metrics.h"
#include "worker/comm/kv_client.h"
#include "worker/trainer.h"

namespace cohort::worker {

struct EngineTrainerOptions {
  // host:port of the coordinator (its KeyValue service bootstraps the
  // communicators; its Checkpoints service stores the checkpoints).
  std::string coordinator;
  // OpenMP threads for compute; 0 = all cores.
  int num_threads = 0;
  // Bound on building the communicators (all peers must publish).
  absl::Duration bootstrap_timeout = absl::Seconds(120);
  // Bound on each collective of a step.
  absl::Duration collective_timeout = absl::Seconds(60);
  // Bound on restoring from a checkpoint, and on each upload.
  absl::Duration checkpoint_timeout = absl::Minutes(10);
  // Called from the training thread when a run ends on its own (see above).
  std::function<void(const JobId&, Generation, const absl::Status&)> on_finished;
  // Makes the bootstrap KvClient for a scope; default: the coordinator's.
  std::function<std::unique_ptr<comm::KvClient>(const comm::KvScopeRef&)> kv_factory;
  // Makes the checkpoint client; default: gRPC to `coordinator`.
  std::function<std::unique_ptr<checkpoint::CheckpointClient>()> checkpoint_factory;
  // Where the checkpoint metrics go (none when null).
  std::shared_ptr<prometheus::Registry> registry;
  // When set, one line per completed step is appended to this file:
  //   job <id> generation <g> step <s> loss <loss as %a>
  // (hex float, exact bits), for comparing trajectories across runs.
  std::string loss_log;
};

class EngineTrainer : public Trainer {
 public:
  explicit EngineTrainer(EngineTrainerOptions options);
  ~EngineTrainer() override;

  // Errors: the spec's (InvalidArgument naming the field; Unimplemented for
  // GPU jobs), the data's (NotFound, DataLoss), the bootstrap's
  // (DeadlineExceeded when peers never show up, Aborted when the generation
  // ends first), the restore's (FailedPrecondition for a checkpoint of
  // another model or a missing resume_from checkpoint, DataLoss for a
  // corrupt one), Cancelled when Stop() interrupts it.
  absl::Status Prepare(const Assignment& assignment) override;
  void Stop() override;
  TrainingProgress progress() const override;

 private:
  // One generation's resources; destroyed in reverse order.
  struct Run;

  absl::StatusOr<std::unique_ptr<Run>> Build(const Assignment& assignment);
  // Loads the newest committed checkpoint that applies into the run's
  // session; returns the step to resume at (0: none).
  absl::StatusOr<int64_t> Restore(const Assignment& assignment, Run* run);
  void Train(Run* run);
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineTrainerOptions options_;
  std::unique_ptr<checkpoint::CheckpointMetrics> checkpoint_metrics_;
  std::atomic<bool> cancelled_{false};

  absl::Mutex mu_;  // Prepare/Stop
  std::unique_ptr<Run> run_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex progress_mu_;
  TrainingProgress progress_ ABSL_GUARDED_BY(progress_mu_);
};

}  // namespace cohort::worker
