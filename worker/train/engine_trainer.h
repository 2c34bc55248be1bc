#pragma once
// EngineTrainer: the worker's Trainer that really trains. Prepare builds,
// for the assignment's generation, the communicators (UCX context over the
// whole mesh, bootstrapped through the coordinator's KeyValue service scoped
// to (job, generation); one communicator per mesh axis group in use) and a
// TrainingSession, then starts a training thread that runs steps until the
// job's step count, reporting progress, and tells the agent when it ends.
//
// How a run ends:
//   all steps done              on_finished(OK)         -> COMPLETED
//   a peer died (Unavailable)   nothing: the coordinator notices the death
//                               and sends Reconfigure (a new Prepare) or Stop
//   Stop()/a new Prepare        nothing (Aborted is expected)
//   anything else               on_finished(error)      -> FAILED
//
// A new generation restarts from step 0 with freshly initialised weights:
// this engine keeps no checkpoint yet (checkpoints land with a later issue),
// and says so in the log.
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
#include "worker/comm/kv_client.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"
#include "worker/trainer.h"
#include "worker/train/training_session.h"

namespace cohort::train {

struct EngineTrainerOptions {
  // host:port of the coordinator (its KeyValue service bootstraps the
  // communicators).
  std::string coordinator;
  // OpenMP threads for compute; 0 = all cores.
  int num_threads = 0;
  // Bound on building the communicators (all peers must publish).
  absl::Duration bootstrap_timeout = absl::Seconds(120);
  // Bound on each collective of a step.
  absl::Duration collective_timeout = absl::Seconds(60);
  // Called from the training thread when a run ends on its own (see above).
  std::function<void(const JobId&, Generation, const absl::Status&)> on_finished;
  // Makes the bootstrap KvClient for a scope; default: the coordinator's.
  std::function<std::unique_ptr<comm::KvClient>(const comm::KvScopeRef&)> kv_factory;
};

class EngineTrainer : public worker::Trainer {
 public:
  explicit EngineTrainer(EngineTrainerOptions options);
  ~EngineTrainer() override;

  // Errors: the spec's (InvalidArgument naming the field; Unimplemented for
  // tensor/pipeline parallelism or GPU jobs), the data's (NotFound, DataLoss),
  // the bootstrap's (DeadlineExceeded when peers never show up, Aborted when
  // the generation ends first), Cancelled when Stop() interrupts it.
  absl::Status Prepare(const worker::Assignment& assignment) override;
  void Stop() override;
  worker::TrainingProgress progress() const override;

 private:
  // One generation's resources; destroyed in reverse order.
  struct Run;

  absl::StatusOr<std::unique_ptr<Run>> Build(const worker::Assignment& assignment);
  void Train(Run* run);
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineTrainerOptions options_;
  std::atomic<bool> cancelled_{false};

  absl::Mutex mu_;  // Prepare/Stop
  std::unique_ptr<Run> run_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex progress_mu_;
  worker::TrainingProgress progress_ ABSL_GUARDED_BY(progress_mu_);
};

}  // namespace cohort::train
