#pragma once
// GenerationRun: one generation of a job as this worker holds it, and the
// lifecycle of its training thread.
//
// Its resources: the generation's communicators (when it has more than one
// participant), the rank's TrainingSession (members only) with the tracked
// communicators it trains over, the checkpoint client and writer, the loss
// log. They are destroyed in reverse order; destroying a run stops its
// thread first (Aborted on every communicator ends a step in flight).
//
// Its lifecycle: SessionBuilder fills it, StateRestorer loads its state,
// SessionCache holds it while it is the current or the kept generation, and
// Start runs RunTrainingLoop (worker/engine/training_loop.h) on its own
// thread, turning how the loop ended into the callbacks:
//   all steps done              on_finished(OK)
//   a peer died                 on_suspended(the states held)
//   stopped (Halt, a new run)   nothing
//   anything else               on_finished(error)
//
// Thread-safety: the fields are set before Start and read by the training
// thread afterwards; `stop` and `trained` are atomic. Halt and Abort may be
// called from any thread; Start and Halt are not called concurrently with
// each other. `kept` is changed by the owner while the thread is not
// running, or by the session's on_first_update hook on the training thread
// itself.

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "cohort/v1/workers.pb.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/layout/mesh_layout.h"
#include "worker/agent/trainer.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/state_transfer.h"
#include "worker/comm/call_watchdog.h"
#include "worker/comm/tracked_communicator.h"
#include "worker/engine/generation_comms.h"
#include "worker/train/training_config.h"
#include "worker/train/training_session.h"

namespace cohort::worker {

// The facts of an assignment a run is described by, for telling which
// session fits which place.

// The state layout of `assignment`'s generation.
checkpoint::StateLayout StateLayoutOf(const Assignment& assignment);
// Where `assignment`'s data group puts its optimizer copies.
layout::CopyRing CopyRingOf(const Assignment& assignment);
// Whether the run may ever need its previous state versions: unless the job
// can never have a peer.
bool KeepsPrevious(const Assignment& assignment);
// The engine's view of `assignment`: its spec, with the plan's split of the
// step's micro-batches over the data ranks (Mesh.micro_batches), which the
// coordinator makes and the worker takes.
absl::StatusOr<train::TrainingConfig> TrainingConfigOf(const Assignment& assignment);
v1::HeldState HeldAt(Generation generation, int64_t step);

// What a completed step makes of the worker's progress.
struct StepReport {
  Step step{0};
  double loss = 0;
  double step_time_seconds = 0;
  double tokens_per_second = 0;
  // Over the run's last kRateWindowSteps steps: tokens over their seconds,
  // so a slow step weighs by its time.
  double tokens_per_second_average = 0;
};

// Called from the training thread.
struct GenerationRunCallbacks {
  // After every completed step, before on_first_step.
  std::function<void(const StepReport&)> on_step;
  // After every validation: the step it followed and its loss.
  std::function<void(Step done, double loss)> on_validation;
  // After every checkpoint taken: how long the loop was blocked by it.
  std::function<void(absl::Duration stall)> on_checkpoint;
  // The run's first completed step (EngineTrainerOptions::on_first_step).
  std::function<void(const JobId&, Generation)> on_first_step;
  std::function<void(const JobId&, Generation, const absl::Status&)> on_finished;
  std::function<void(const JobId&, Generation, const std::vector<v1::HeldState>&,
                     const absl::Status&)>
      on_suspended;
};

struct GenerationRun {
  JobId job_id;
  Generation generation;
  v1::JobSpec spec;
  v1::Mesh mesh;
  v1::MeshCoordinates coordinates;
  checkpoint::StateLayout layout;
  cohort::layout::CopyRing copy_ring;  // of its data group (a session's mirrors follow it)
  int participant = 0;
  int participants = 1;
  int64_t steps = 0;
  int64_t start_step = 0;
  int64_t checkpoint_interval = 0;
  std::unique_ptr<GenerationComms> comms;  // when it has more than one participant
  // What the call watchdog aborts when one of the tracked communicators'
  // calls overruns: every communicator of this generation (Abort).
  comm::AbortDomain watched{[this](const absl::Status& reason) { Abort(reason); }};
  // The mesh groups as the step runner sees them: counted, for
  // waiting_for_peers.
  std::unique_ptr<comm::TrackedCommunicator> tracked_data, tracked_tensor, tracked_pipeline;
  std::unique_ptr<train::TrainingSession> session;  // members only
  std::unique_ptr<client::CheckpointClient> checkpoints;
  std::unique_ptr<checkpoint::CheckpointWriter> writer;  // when checkpointing
  checkpoint::ArenaRange optimizer;
  bool keep_previous = false;  // the session's StateVersionOptions
  // Older generations whose session this run kept, and whose state it holds
  // until it has trained a step (a kept session's restore moves nothing).
  std::vector<Generation> also_holds;
  bool from_warm = false;            // its session was a warm spare's
  double communicators_seconds = 0;  // of the build: building `comms`
  uint64_t warm_bytes = 0;           // a warm spare's: the session's estimated memory
  std::FILE* loss_log = nullptr;
  std::atomic<bool> stop{false};
  std::atomic<bool> trained{false};  // completed a step in this generation
  // The source generation's state, kept (SessionCache's previous run) until
  // this run trains a step: reported with this run's own when a peer fails
  // first, or the coordinator would not know it survives.
  std::vector<v1::HeldState> kept;

  GenerationRun() = default;
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;
  ~GenerationRun();

  // What a generation of `assignment` is.
  void Describe(const Assignment& assignment);

  // Makes every call of the run's communicators return `reason`.
  void Abort(const absl::Status& reason);

  // Starts training from start_step on the run's thread, timed by `clock`
  // (which must outlive the run).
  void Start(const Clock* clock, GenerationRunCallbacks callbacks);

  // Ends the training thread (if any) and waits for it; the state stays.
  void Halt(const absl::Status& reason);

  // Appends the line that says this generation resumes at start_step (older
  // generations' lines of later steps are superseded), timed by `clock`.
  void LogResume(const Clock& clock);

 private:
  void Train(const Clock* clock, const GenerationRunCallbacks& callbacks);

  // (tokens, seconds) of the newest steps, for the windowed rate; the
  // training thread's.
  std::deque<std::pair<int64_t, double>> rate_window_;
  std::thread thread_;
};

}  // namespace cohort::worker
