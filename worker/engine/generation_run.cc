#include "worker/engine/generation_run.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/layout/mesh_hosts.h"
#include "common/layout/mesh_proto.h"
#include "worker/engine/training_loop.h"

namespace cohort::worker {

checkpoint::StateLayout StateLayoutOf(const Assignment& assignment) {
  return checkpoint::StateLayout{layout::ShapeOf(assignment.mesh),
                                 assignment.spec.parallelism().zero1(),
                                 assignment.spec.elastic().optimizer_replicas()};
}

layout::CopyRing CopyRingOf(const Assignment& assignment) {
  return layout::CopyRingOf(assignment.mesh, layout::CoordsOf(assignment.coordinates));
}

bool KeepsPrevious(const Assignment& assignment) {
  return std::max(assignment.spec.elastic().max_workers(), assignment.mesh.members_size()) > 1;
}

absl::StatusOr<train::TrainingConfig> TrainingConfigOf(const Assignment& assignment) {
  const v1::Mesh& mesh = assignment.mesh;
  std::vector<int> shares(mesh.micro_batches().begin(), mesh.micro_batches().end());
  const int dp = layout::ShapeOf(mesh).data;
  if (static_cast<int>(shares.size()) != dp && !(shares.empty() && dp == 1)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the mesh (", layout::DegreesText(mesh), ") splits the step's micro-batches over ",
        shares.size(), " data ranks, not its ", dp, " (Mesh.micro_batches)"));
  }
  return train::TrainingConfigFromSpec(assignment.spec, std::move(shares));
}

v1::HeldState HeldAt(Generation generation, int64_t step) {
  v1::HeldState state;
  state.set_generation(generation.value());
  state.set_step(step);
  return state;
}

GenerationRun::~GenerationRun() {
  stop = true;
  Abort(absl::AbortedError("generation released"));
  if (thread_.joinable()) thread_.join();
  writer.reset();  // waits for its upload
  if (loss_log != nullptr) std::fclose(loss_log);
}

void GenerationRun::Describe(const Assignment& assignment) {
  job_id = assignment.job_id;
  generation = assignment.generation;
  spec = assignment.spec;
  mesh = assignment.mesh;
  coordinates = assignment.coordinates;
  layout = StateLayoutOf(assignment);
  copy_ring = CopyRingOf(assignment);
  participant = assignment.participant;
}

void GenerationRun::Abort(const absl::Status& reason) {
  if (comms != nullptr) comms->Abort(reason);
}

void GenerationRun::Start(const Clock* clock, GenerationRunCallbacks callbacks) {
  thread_ =
      std::thread([this, clock, callbacks = std::move(callbacks)] { Train(clock, callbacks); });
}

void GenerationRun::Halt(const absl::Status& reason) {
  stop = true;
  Abort(reason);
  if (thread_.joinable()) thread_.join();
}

void GenerationRun::LogResume(const Clock& clock) {
  if (loss_log == nullptr) return;
  // Steps above this one logged by older generations are superseded: this
  // generation trains them again (docs/operations.md, "Loss log").
  std::fprintf(loss_log, "job %s generation %llu resume %lld time %.6f\n", job_id.value().c_str(),
               static_cast<unsigned long long>(generation.value()),
               static_cast<long long>(start_step),
               absl::ToDoubleSeconds(clock.Now() - absl::UnixEpoch()));
  std::fflush(loss_log);
}

void GenerationRun::Train(const Clock* clock, const GenerationRunCallbacks& callbacks) {
  TrainingLoopInput input;
  input.job = job_id;
  input.generation = generation;
  input.session = session.get();
  input.start_step = start_step;
  input.steps = steps;
  input.writer = writer.get();
  input.checkpoint_interval = checkpoint_interval;
  input.optimizer = optimizer;
  input.loss_log = loss_log;
  input.stop = &stop;
  input.clock = clock;
  TrainingLoopHooks hooks;
  hooks.on_step = [this, &callbacks](Step done, const train::StepResult& result,
                                     absl::Duration took) {
    const bool first = !trained;
    trained = true;
    StepReport report;
    const double seconds = absl::ToDoubleSeconds(took);
    report.step = done;
    report.loss = result.loss;
    report.step_time_seconds = seconds;
    report.tokens_per_second = static_cast<double>(result.tokens) / seconds;
    rate_window_.emplace_back(result.tokens, seconds);
    if (rate_window_.size() > static_cast<size_t>(kRateWindowSteps)) rate_window_.pop_front();
    double tokens = 0, window_seconds = 0;
    for (const auto& [step_tokens, step_seconds] : rate_window_) {
      tokens += static_cast<double>(step_tokens);
      window_seconds += step_seconds;
    }
    report.tokens_per_second_average = window_seconds > 0 ? tokens / window_seconds : 0;
    if (callbacks.on_step) callbacks.on_step(report);
    // After the progress is set: the callback's report carries it.
    if (first && callbacks.on_first_step) callbacks.on_first_step(job_id, generation);
  };
  if (callbacks.on_validation) {
    hooks.on_validation = [&callbacks](Step done, double loss, absl::Duration) {
      callbacks.on_validation(done, loss);
    };
  }
  hooks.on_checkpoint = callbacks.on_checkpoint;
  const TrainingLoopOutcome outcome = RunTrainingLoop(input, hooks);
  switch (outcome.end) {
    case TrainingLoopEnd::kStopped:
      return;
    case TrainingLoopEnd::kPeerLost: {
      if (!callbacks.on_suspended) return;
      std::vector<v1::HeldState> held;
      if (outcome.newest_state >= 0) held.push_back(HeldAt(generation, outcome.newest_state));
      // Until this generation has trained, the source generation's state is
      // held too, or the coordinator would not know it survives.
      if (!trained) held.insert(held.end(), kept.begin(), kept.end());
      callbacks.on_suspended(job_id, generation, held, outcome.status);
      return;
    }
    case TrainingLoopEnd::kFailed:
      if (callbacks.on_finished) callbacks.on_finished(job_id, generation, outcome.status);
      return;
    case TrainingLoopEnd::kCompleted:
      if (callbacks.on_finished) callbacks.on_finished(job_id, generation, absl::OkStatus());
      return;
  }
}

}  // namespace cohort::worker
