#include "worker/engine/engine_trainer.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/train/training_session.h"

namespace cohort::worker {

EngineTrainer::EngineTrainer(EngineTrainerOptions options)
    : options_(std::move(options)),
      checkpoint_metrics_(options_.registry != nullptr
                              ? std::make_unique<checkpoint::CheckpointMetrics>(options_.registry)
                              : nullptr),
      builder_(options_, &interrupts_, checkpoint_metrics_.get()),
      restorer_(options_, checkpoint_metrics_.get()),
      warm_(options_.warm_memory_bytes,
            [this](const Assignment& slot) { return builder_.BuildWarm(slot); }) {}

EngineTrainer::~EngineTrainer() { Stop(); }

void EngineTrainer::Warm(const Assignment& slot) { warm_.Warm(slot); }

v1::WarmSpare EngineTrainer::warm_status() const { return warm_.status(); }

void EngineTrainer::BeginProgress(const Assignment& assignment) {
  // Until the state is restored the step is the one it will resume at.
  absl::MutexLock progress_lock(&progress_mu_);
  std::vector<ValidationPoint> validations = std::move(progress_.recent_validations);
  if (validations_job_ != assignment.job_id) validations.clear();
  validations_job_ = assignment.job_id;
  progress_ = TrainingProgress{};
  progress_.step = Step(assignment.recovery.step());
  progress_.recent_validations = std::move(validations);
}

EngineTrainer::SessionChoice EngineTrainer::ChooseSessionsLocked(const Assignment& assignment) {
  SessionChoice choice;
  // The generation the plan takes state from must stay until this one
  // has trained; everything else can go.
  const v1::RecoveryPlan& plan = assignment.recovery;
  const bool peer = plan.kind() == v1::RECOVERY_KIND_PEER;
  choice.source = peer ? held_.Find(plan.source_generation()) : nullptr;
  if (choice.source != nullptr && SessionBuilder::CanKeepSession(*choice.source, assignment)) {
    choice.keep = choice.source;
  }
  // A warm spare's session for this place, or one whose model shard fits
  // it (or nothing: what was prepared for another is released first).
  choice.warm = warm_.Take(assignment);
  if (choice.keep != nullptr) choice.warm.reset();
  choice.warm_fits =
      choice.warm != nullptr && SessionBuilder::CanKeepSession(*choice.warm, assignment);
  // Otherwise a new session takes over what fits of the warm one's or the
  // source's (the model shard when only the data rank or dp changed).
  if (choice.keep == nullptr && !choice.warm_fits) {
    if (choice.warm != nullptr) {
      choice.reuse = choice.warm.get();
    } else if (choice.source != nullptr &&
               SessionBuilder::CanReuseSession(*choice.source, assignment)) {
      choice.reuse = choice.source;
    }
  }
  return choice;
}

absl::Status EngineTrainer::Prepare(const Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  held_.Suspend(absl::AbortedError("trainer suspended"));
  interrupts_.Begin(assignment);
  absl::Cleanup end_interruptible = [this] { interrupts_.End(); };
  BeginProgress(assignment);
  const Clock& clock = *options_.clock;
  const v1::RecoveryPlan& plan = assignment.recovery;
  PrepareTimes times;
  times.start = clock.Now();
  SessionChoice choice = ChooseSessionsLocked(assignment);
  GenerationRun* const source = choice.source;
  GenerationRun* const keep = choice.keep;
  absl::StatusOr<std::unique_ptr<GenerationRun>> built = builder_.Build(
      assignment, keep, choice.warm_fits ? choice.warm.get() : nullptr, choice.reuse);
  if (built.ok() && choice.warm != nullptr && choice.reuse == choice.warm.get()) {
    (*built)->from_warm = (*built)->session->reused_model();
  }
  choice.warm.reset();
  times.built = clock.Now();
  if (!built.ok()) return built.status();
  std::unique_ptr<GenerationRun> run = *std::move(built);
  interrupts_.SetBuilding(run.get());
  train::StateVersions& versions = run->session->runner().versions();
  // A session around the source's model shard writes the weights the source
  // generation holds as its current version: unless they already are the
  // plan's step, that generation keeps only its previous version.
  GenerationRun* const shares_model =
      choice.reuse != nullptr && choice.reuse == source && run->session->reused_model()
          ? choice.reuse
          : nullptr;
  if (shares_model != nullptr) {
    train::StateVersions& older = shares_model->session->runner().versions();
    if (older.current() != plan.step()) older.BeginRestore();
  }
  // A kept session serves the source state from its own buffers. Unless
  // they hold the plan's step already, the restore overwrites them (from
  // their previous version, or from peers): until it is done they hold no
  // consistent state.
  const bool in_place = keep != nullptr && versions.current() == plan.step();
  if (keep != nullptr && !in_place) versions.BeginRestore();
  absl::StatusOr<RestoredState> restored =
      restorer_.Restore(assignment, run.get(), keep != nullptr ? run.get() : source);
  times.restored = clock.Now();
  absl::Status mirrored;
  if (restored.ok()) {
    if (keep == nullptr) {
      versions.SetCurrent(restored->step);
    } else if (!in_place) {
      versions.EndRestore(restored->step);
    }
    // The new layout's mirrors, from the restored moments.
    mirrored = versions.ExchangeMirrors(run->session->data_parallel().group(), restored->step,
                                        options_.collective_timeout, /*only_missing=*/true);
  }
  interrupts_.SetBuilding(nullptr);
  absl::Status prepared = interrupts_.cancelled()
                              ? absl::CancelledError("trainer interrupted during Prepare")
                          : !restored.ok() ? restored.status()
                                           : mirrored;
  if (!prepared.ok()) {
    // The kept session goes back to the generation it came from, with what
    // it still holds: the next plan may recover from it.
    if (keep != nullptr) {
      if (absl::Status back = SessionBuilder::MoveSession(run.get(), keep); !back.ok()) {
        LOG(ERROR) << "job " << assignment.job_id << ": the kept session is lost: " << back;
      }
    }
    return prepared;
  }
  run->start_step = restored->step;
  times.mirrored = clock.Now();
  RecordPrepare(*run, times, restored->bytes, keep != nullptr, shares_model != nullptr);
  run->LogResume(clock);
  builder_.AddCheckpointWriter(assignment, run.get());
  GenerationRun* const training =
      held_.Install(std::move(run), source, keep != nullptr, shares_model);
  {
    absl::MutexLock progress_lock(&progress_mu_);
    progress_.step = Step(training->start_step);
  }
  training->Start(options_.clock, RunCallbacks());
  return absl::OkStatus();
}

void EngineTrainer::RecordPrepare(const GenerationRun& run, const PrepareTimes& times,
                                  uint64_t restore_bytes, bool session_kept, bool model_kept) {
  absl::MutexLock progress_lock(&progress_mu_);
  const double build_seconds = absl::ToDoubleSeconds(times.built - times.start);
  last_prepare_.set_build_seconds(build_seconds);
  last_prepare_.set_restore_seconds(absl::ToDoubleSeconds(times.mirrored - times.built));
  last_prepare_.set_communicators_seconds(run.communicators_seconds);
  // The rest of the build: releasing or taking a prepared session, and
  // building one when there was none to keep or take.
  last_prepare_.set_session_seconds(std::max(0.0, build_seconds - run.communicators_seconds));
  last_prepare_.set_transfer_seconds(absl::ToDoubleSeconds(times.restored - times.built));
  last_prepare_.set_mirrors_seconds(absl::ToDoubleSeconds(times.mirrored - times.restored));
  last_prepare_.set_restore_bytes(restore_bytes);
  last_prepare_.set_session_kept(session_kept);
  last_prepare_.set_session_warm(run.from_warm);
  last_prepare_.set_model_kept(model_kept);
}

GenerationRunCallbacks EngineTrainer::RunCallbacks() {
  GenerationRunCallbacks callbacks;
  callbacks.on_step = [this](const StepReport& report) {
    absl::MutexLock lock(&progress_mu_);
    progress_.step = report.step;
    progress_.loss = report.loss;
    progress_.step_time_seconds = report.step_time_seconds;
    progress_.tokens_per_second = report.tokens_per_second;
    progress_.tokens_per_second_average = report.tokens_per_second_average;
  };
  callbacks.on_validation = [this](Step done, double loss) {
    absl::MutexLock lock(&progress_mu_);
    std::vector<ValidationPoint>& recent = progress_.recent_validations;
    // A repeat (a generation that resumed where one was due) replaces it.
    if (!recent.empty() && recent.back().step == done) recent.pop_back();
    recent.push_back(ValidationPoint{done, loss});
    if (recent.size() > static_cast<size_t>(kRecentValidations)) recent.erase(recent.begin());
  };
  if (checkpoint_metrics_ != nullptr) {
    callbacks.on_checkpoint = [metrics = checkpoint_metrics_.get()](absl::Duration stall) {
      metrics->Saved(stall);
    };
  }
  callbacks.on_first_step = options_.on_first_step;
  callbacks.on_finished = options_.on_finished;
  callbacks.on_suspended = options_.on_suspended;
  return callbacks;
}

absl::Status EngineTrainer::Donate(const Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  held_.Suspend(absl::AbortedError("trainer suspended"));
  interrupts_.Begin(assignment);
  absl::Cleanup end_interruptible = [this] { interrupts_.End(); };
  GenerationRun* source = held_.Find(assignment.recovery.source_generation());
  absl::Status donated = [&]() -> absl::Status {
    if (assignment.recovery.kind() != v1::RECOVERY_KIND_PEER) return absl::OkStatus();
    if (source == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no state of generation ", assignment.recovery.source_generation(), " to donate"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<GenerationRun> run,
                     builder_.Build(assignment, nullptr, nullptr, nullptr));
    interrupts_.SetBuilding(run.get());
    absl::StatusOr<RestoredState> served = restorer_.Restore(assignment, run.get(), source);
    interrupts_.SetBuilding(nullptr);
    return served.status();
  }();
  // A donor keeps nothing once its state is handed over. A donation that
  // failed (interrupted by the next re-plan, a participant gone) keeps the
  // source state: the next plan may still recover from it.
  if (donated.ok()) held_.Clear(absl::AbortedError("trainer stopped"));
  return donated;
}

std::vector<v1::HeldState> EngineTrainer::Suspend() {
  absl::MutexLock lock(&mu_);
  held_.Suspend(absl::AbortedError("trainer suspended"));
  return held_.HeldStates();
}

void EngineTrainer::Interrupt(const JobId& job, Generation generation) {
  interrupts_.Interrupt(job, generation);
}

void EngineTrainer::Stop() {
  interrupts_.InterruptAll();
  absl::MutexLock lock(&mu_);
  held_.Clear(absl::AbortedError("trainer stopped"));
}

const float* EngineTrainer::weights_for_testing() {
  absl::MutexLock lock(&mu_);
  const GenerationRun* run = held_.current();
  return run != nullptr && run->session != nullptr ? std::as_const(*run->session).model().params()
                                                   : nullptr;
}

v1::PreparePhases EngineTrainer::last_prepare() const {
  absl::MutexLock lock(&progress_mu_);
  return last_prepare_;
}

TrainingProgress EngineTrainer::progress() const {
  absl::MutexLock lock(&progress_mu_);
  TrainingProgress progress = progress_;
  progress.waiting_for_peers = builder_.in_collective();
  return progress;
}

}  // namespace cohort::worker
