#pragma once
// GenerationComms: the communicators one generation of a job trains and
// recovers over, whatever implements them. EngineTrainer gets them from its
// CommsFactory: UCX by default (worker/engine/ucx_generation_comms.h); tests give
// in-process ones (tests/testing/thread_comms.h), so that building a
// generation, the restore from peers and the training loop run in one
// process without a transport.
//
// Thread-safety: Abort from any thread; the communicators as Communicator.

#include <atomic>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "worker/agent/trainer.h"
#include "worker/comm/communicator.h"
#include "worker/train/training_session.h"

namespace cohort::worker {

struct CommsRequest {
  const Assignment* assignment = nullptr;
  // This worker's index among the generation's participants (the mesh's
  // members, then a peer recovery's donors) and their number.
  int participant = 0;
  int participants = 1;
  // The data, tensor and pipeline groups of this member (a member of a mesh
  // of more than one worker).
  bool mesh_groups = false;
  // One communicator over every participant, for a peer recovery's state
  // transfers.
  bool world = false;
  // Set when the build is to be abandoned (EngineTrainer::Interrupt): a
  // factory waiting for peers returns Cancelled soon after.
  const std::atomic<bool>* cancelled = nullptr;
  // What the factory's deadlines are measured by (EngineTrainerOptions::clock).
  const Clock* clock = RealClock::Get();
};

class GenerationComms {
 public:
  virtual ~GenerationComms() = default;
  // The member's mesh groups; null where an axis has one rank or none was
  // asked for.
  virtual train::TrainingGroups groups() const = 0;
  // Over every participant; null unless asked for.
  virtual comm::Communicator* world() const = 0;
  // Makes every in-flight and later call of every communicator return
  // Aborted. Idempotent.
  virtual void Abort(const absl::Status& reason) = 0;
};

using CommsFactory =
    std::function<absl::StatusOr<std::unique_ptr<GenerationComms>>(const CommsRequest&)>;

}  // namespace cohort::worker
