#include "worker/engine/training_loop.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "common/status_macros.h"

namespace cohort::worker {
namespace {

bool Stopped(const TrainingLoopInput& input) {
  return input.stop != nullptr && input.stop->load();
}

void LogLoss(const TrainingLoopInput& input, int64_t done, double loss) {
  if (input.loss_log == nullptr) return;
  std::fprintf(input.loss_log, "job %s generation %llu step %lld loss %a time %.6f\n",
               input.job.value().c_str(), static_cast<unsigned long long>(input.generation.value()),
               static_cast<long long>(done), loss,
               absl::ToDoubleSeconds(input.clock->Now() - absl::UnixEpoch()));
  std::fflush(input.loss_log);
}

void LogValidation(const TrainingLoopInput& input, int64_t done, double loss) {
  if (input.loss_log == nullptr) return;
  // "validation" where step lines say "step": readers of step lines skip it.
  std::fprintf(input.loss_log, "job %s generation %llu validation %lld loss %a time %.6f\n",
               input.job.value().c_str(), static_cast<unsigned long long>(input.generation.value()),
               static_cast<long long>(done), loss,
               absl::ToDoubleSeconds(input.clock->Now() - absl::UnixEpoch()));
  std::fflush(input.loss_log);
}

// How a failed step or validation ends the loop.
void EndWithError(const TrainingLoopInput& input, const char* what, int64_t s,
                  const absl::Status& status, TrainingLoopOutcome* outcome) {
  outcome->status = status;
  if (Stopped(input) || absl::IsAborted(status)) {
    outcome->end = TrainingLoopEnd::kStopped;
  } else if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    LOG(WARNING) << "job " << input.job << " generation " << input.generation << " " << what
                 << " " << s << ": " << status << "; state kept for the next generation";
    outcome->end = TrainingLoopEnd::kPeerLost;
    outcome->newest_state = input.session->runner().versions().newest();
  } else {
    LOG(ERROR) << "job " << input.job << " " << what << " " << s << " failed: " << status;
    outcome->end = TrainingLoopEnd::kFailed;
  }
}

// Runs the validation after `done` steps; false (with `outcome` set) when
// it failed and the loop must end.
bool Validate(const TrainingLoopInput& input, const TrainingLoopHooks& hooks, int64_t done,
              TrainingLoopOutcome* outcome) {
  const absl::Time begin = input.clock->Now();
  // Validation reads the weights only (a checkpoint of this step may be
  // uploading meanwhile).
  absl::StatusOr<double> loss = input.session->Validate(input.stop);
  if (!loss.ok()) {
    EndWithError(input, "validation after step", done, loss.status(), outcome);
    return false;
  }
  LogValidation(input, done, *loss);
  LOG(INFO) << "job " << input.job << " step " << done << " validation loss " << *loss;
  if (hooks.on_validation) hooks.on_validation(Step(done), *loss, input.clock->Now() - begin);
  return true;
}

// A checkpoint of state that stays in backend memory: a snapshot taken
// there and drained beside the next steps (train::DeviceSnapshot), which the
// upload waits for on its own thread. The stall is the previous upload's
// end plus the time to enqueue the snapshot's copies.
absl::StatusOr<absl::Duration> SnapshotAndSave(const TrainingLoopInput& input, int64_t done) {
  train::TrainingSession& session = *input.session;
  train::DeviceSnapshot* snapshot = session.device_snapshot();
  const absl::Time start = absl::Now();
  // The previous upload reads the snapshot's host copy until it ends.
  input.writer->Wait();
  RETURN_IF_ERROR(session.TakeSnapshot());
  const train::DataParallel& data = session.data_parallel();
  RETURN_IF_ERROR(input.writer
                      ->SaveDrained(Step(done), snapshot->host(),
                                    {data.update_begin(), data.update_end()},
                                    [snapshot] { return snapshot->Wait(); })
                      .status());
  return absl::Now() - start;
}

void MaybeCheckpoint(const TrainingLoopInput& input, const TrainingLoopHooks& hooks,
                     int64_t done) {
  if (input.writer == nullptr || input.checkpoint_interval <= 0) return;
  if (done % input.checkpoint_interval != 0 && done != input.steps) return;
  train::TrainingSession& session = *input.session;
  absl::StatusOr<absl::Duration> stall = session.device_snapshot() != nullptr
                                             ? SnapshotAndSave(input, done)
                                             : input.writer->Save(
      Step(done),
      checkpoint::StateView{std::as_const(session).model().params(),
                            std::as_const(session).runner().adam_m(),
                            std::as_const(session).runner().adam_v(), input.optimizer});
  if (!stall.ok()) {
    LOG(WARNING) << "job " << input.job << " step " << done
                 << ": checkpoint not taken: " << stall.status();
  } else if (hooks.on_checkpoint) {
    hooks.on_checkpoint(*stall);
  }
}

}  // namespace

TrainingLoopOutcome RunTrainingLoop(const TrainingLoopInput& input,
                                    const TrainingLoopHooks& hooks) {
  TrainingLoopOutcome outcome;
  const absl::Time started = input.clock->Now();
  absl::Time last_log = started;
  train::TrainingSession& session = *input.session;
  // A generation that starts where a validation was due (one interrupted
  // during it, or a restore from a checkpoint of that step) runs it first:
  // the coordinator keeps one point per step, so a repeat costs only time.
  if (input.start_step > 0 && session.config().ValidatesAfter(input.start_step) &&
      !Validate(input, hooks, input.start_step, &outcome)) {
    return outcome;
  }
  for (int64_t s = input.start_step; s < input.steps; ++s) {
    if (Stopped(input)) {
      outcome.end = TrainingLoopEnd::kStopped;
      return outcome;
    }
    const absl::Time begin = input.clock->Now();
    // A Suspend or Stop ends the step within one layer's compute.
    absl::StatusOr<train::StepResult> result = session.RunStep(Step(s), input.stop);
    if (!result.ok()) {
      EndWithError(input, "step", s, result.status(), &outcome);
      return outcome;
    }
    const absl::Duration took = std::max(input.clock->Now() - begin, absl::Nanoseconds(1));
    const int64_t done = s + 1;
    ++outcome.steps_done;
    LogLoss(input, done, result->loss);
    MaybeCheckpoint(input, hooks, done);
    if (hooks.on_step) hooks.on_step(Step(done), *result, took);
    if (session.config().ValidatesAfter(done) && !Validate(input, hooks, done, &outcome)) {
      return outcome;
    }
    if (input.clock->Now() - last_log >= absl::Seconds(10) || done == input.steps) {
      last_log = input.clock->Now();
      const double seconds = absl::ToDoubleSeconds(took);
      LOG(INFO) << "job " << input.job << " step " << done << "/" << input.steps << " loss "
                << result->loss << " grad norm " << result->grad_norm << " lr "
                << result->learning_rate << " "
                << static_cast<int64_t>(static_cast<double>(result->tokens) / seconds)
                << " tokens/s";
    }
  }
  if (input.writer != nullptr) {
    // The job completes only once its final checkpoint is in (or failed).
    const checkpoint::UploadResult last = input.writer->Wait();
    if (!last.status.ok()) {
      LOG(WARNING) << "job " << input.job << ": the final checkpoint (step " << last.step
                   << ") was not saved: " << last.status;
    }
  }
  LOG(INFO) << "job " << input.job << " finished " << input.steps << " steps in "
            << absl::FormatDuration(
                   absl::Trunc(input.clock->Now() - started, absl::Milliseconds(1)));
  outcome.end = TrainingLoopEnd::kCompleted;
  return outcome;
}

}  // namespace cohort::worker
