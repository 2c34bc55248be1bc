#include "worker/engine_trainer.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/comm/mesh_groups.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"
#include "worker/train/mesh_communicators.h"
#include "worker/train/training_session.h"

namespace cohort::worker {
namespace {

// Wraps the bootstrap KvClient so a Stop() during Prepare ends a WaitFor
// within a slice instead of the whole bootstrap timeout.
class CancellableKvClient : public comm::KvClient {
 public:
  CancellableKvClient(std::unique_ptr<comm::KvClient> inner, const std::atomic<bool>* cancelled)
      : inner_(std::move(inner)), cancelled_(cancelled) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (cancelled_->load()) return Cancelled();
    return inner_->Set(key, value);
  }

  absl::StatusOr<std::string> WaitFor(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (cancelled_->load()) return Cancelled();
      const absl::Duration left = deadline - absl::Now();
      absl::StatusOr<std::string> value =
          inner_->WaitFor(key, std::clamp(left, absl::ZeroDuration(), kSlice));
      if (!absl::IsDeadlineExceeded(value.status()) || absl::Now() >= deadline) return value;
    }
  }

 private:
  static constexpr absl::Duration kSlice = absl::Milliseconds(250);
  static absl::Status Cancelled() {
    return absl::CancelledError("trainer stopped while building communicators");
  }
  std::unique_ptr<comm::KvClient> inner_;
  const std::atomic<bool>* cancelled_;
};

}  // namespace

struct EngineTrainer::Run {
  JobId job_id;
  Generation generation;
  int64_t steps = 0;
  int64_t start_step = 0;
  int64_t checkpoint_interval = 0;
  std::unique_ptr<comm::KvClient> kv;
  std::unique_ptr<comm::UcxContext> context;
  train::MeshCommunicators communicators;
  std::unique_ptr<train::TrainingSession> session;
  std::unique_ptr<checkpoint::CheckpointClient> checkpoints;
  std::unique_ptr<checkpoint::CheckpointWriter> writer;  // when checkpointing
  checkpoint::ArenaRange optimizer;
  std::FILE* loss_log = nullptr;
  std::atomic<bool> stop{false};
  std::thread thread;

  ~Run() {
    // The writer waits for its upload; the log closes last.
    writer.reset();
    if (loss_log != nullptr) std::fclose(loss_log);
  }
};

EngineTrainer::EngineTrainer(EngineTrainerOptions options) : options_(std::move(options)) {
  if (options_.registry != nullptr) {
    checkpoint_metrics_ = std::make_unique<checkpoint::CheckpointMetrics>(options_.registry);
  }
}

EngineTrainer::~EngineTrainer() { Stop(); }

absl::StatusOr<std::unique_ptr<EngineTrainer::Run>> EngineTrainer::Build(
    const Assignment& assignment) {
  const v1::Mesh& mesh = assignment.mesh;
  ASSIGN_OR_RETURN(train::TrainingConfig config,
                   train::TrainingConfigFromSpec(assignment.spec, std::max(1, mesh.data_parallel())));
  auto run = std::make_unique<Run>();
  run->job_id = assignment.job_id;
  run->generation = assignment.generation;
  run->steps = config.steps;
  run->checkpoint_interval = assignment.spec.checkpoint().interval_steps();
  const int world = mesh.members_size();
  if (world > 1) {
    ASSIGN_OR_RETURN(comm::MeshGroups groups,
                     comm::ComputeMeshGroups(mesh, assignment.coordinates));
    const comm::KvScopeRef scope{assignment.job_id.value(), assignment.generation.value()};
    std::unique_ptr<comm::KvClient> inner =
        options_.kv_factory ? options_.kv_factory(scope)
                            : comm::NewCoordinatorKvClient(options_.coordinator, scope);
    run->kv = std::make_unique<CancellableKvClient>(std::move(inner), &cancelled_);
    comm::UcxContextOptions context;
    context.rank = groups.rank;
    context.size = groups.world_size;
    context.kv = run->kv.get();
    context.bootstrap_timeout = options_.bootstrap_timeout;
    ASSIGN_OR_RETURN(run->context, comm::UcxContext::Create(context));
    ASSIGN_OR_RETURN(run->communicators, train::CreateMeshCommunicators(run->context.get(), groups));
  }
  const model::ModelLayout layout = train::LayoutOf(mesh, assignment.coordinates);
  train::TrainingSessionOptions session;
  session.num_threads = options_.num_threads;
  session.collective_timeout = options_.collective_timeout;
  ASSIGN_OR_RETURN(run->session, train::TrainingSession::Create(config, layout,
                                                                run->communicators.groups(), session));
  const train::DataParallel& dp = run->session->data_parallel();
  run->optimizer = {dp.update_begin(), dp.update_end()};
  run->checkpoints = options_.checkpoint_factory
                         ? options_.checkpoint_factory()
                         : checkpoint::NewGrpcCheckpointClient(options_.coordinator);
  ASSIGN_OR_RETURN(run->start_step, Restore(assignment, run.get()));
  if (run->checkpoint_interval > 0) {
    checkpoint::CheckpointWriterOptions writer;
    writer.job_id = assignment.job_id.value();
    writer.generation = assignment.generation;
    writer.writer = static_cast<uint32_t>(assignment.coordinates.rank());
    writer.position = {layout, std::max(1, mesh.data_parallel()), assignment.coordinates.data()};
    writer.zero1 = config.zero1;
    writer.upload_timeout = options_.checkpoint_timeout;
    if (checkpoint_metrics_ != nullptr) {
      writer.on_result = [metrics = checkpoint_metrics_.get()](
                             const checkpoint::UploadResult& r) { metrics->Uploaded(r); };
    }
    run->writer = std::make_unique<checkpoint::CheckpointWriter>(
        run->checkpoints.get(), config.model, run->session->model().table(), std::move(writer));
  }
  if (!options_.loss_log.empty()) {
    run->loss_log = std::fopen(options_.loss_log.c_str(), "a");
    if (run->loss_log == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("--loss_log ", options_.loss_log, ": cannot open for appending"));
    }
  }
  return run;
}

absl::StatusOr<int64_t> EngineTrainer::Restore(const Assignment& assignment, Run* run) {
  const v1::CheckpointPolicy& policy = assignment.spec.checkpoint();
  absl::StatusOr<v1::CheckpointManifest> manifest = run->checkpoints->GetManifest(
      assignment.job_id.value(), -1, options_.checkpoint_timeout);
  if (absl::IsNotFound(manifest.status()) && !policy.resume_from_job().empty()) {
    const int64_t step = policy.resume_from_step() > 0 ? policy.resume_from_step() : -1;
    manifest = run->checkpoints->GetManifest(policy.resume_from_job(), step,
                                             options_.checkpoint_timeout);
    if (absl::IsNotFound(manifest.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.resume_from_job: ", manifest.status().message()));
    }
  }
  if (absl::IsNotFound(manifest.status())) return 0;  // nothing to resume from
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat("looking for a checkpoint to resume from: ",
                                     manifest.status().message()));
  }
  train::TrainingSession& session = *run->session;
  checkpoint::LoadStats stats;
  RETURN_IF_ERROR(checkpoint::LoadCheckpoint(
      run->checkpoints.get(), *manifest, session.config().model, session.model().table(),
      checkpoint::StateBuffers{session.model().params(), session.runner().adam_m(),
                               session.runner().adam_v(), run->optimizer},
      options_.checkpoint_timeout, &stats));
  if (checkpoint_metrics_ != nullptr) checkpoint_metrics_->Restored(stats.bytes, stats.duration);
  LOG(INFO) << "job " << assignment.job_id << " generation " << assignment.generation
            << " resumes at step " << manifest->step() << " from the checkpoint of job "
            << manifest->job_id() << " (saved by generation " << manifest->generation() << " as ("
            << manifest->layout().data_parallel() << "," << manifest->layout().tensor_parallel()
            << "," << manifest->layout().pipeline_parallel() << ")): " << stats.chunks
            << " chunks, " << stats.bytes << " bytes in "
            << absl::FormatDuration(absl::Trunc(stats.duration, absl::Milliseconds(1)));
  return manifest->step();
}

absl::Status EngineTrainer::Prepare(const Assignment& assignment) {
  {
    absl::MutexLock lock(&mu_);
    StopLocked();
    cancelled_ = false;
  }
  {
    absl::MutexLock lock(&progress_mu_);
    progress_ = TrainingProgress{};
  }
  absl::StatusOr<std::unique_ptr<Run>> built = Build(assignment);
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("trainer stopped during Prepare");
  if (!built.ok()) return built.status();
  run_ = std::move(*built);
  Run* run = run_.get();
  {
    absl::MutexLock progress_lock(&progress_mu_);
    progress_.step = Step(run->start_step);
  }
  run->thread = std::thread([this, run] { Train(run); });
  return absl::OkStatus();
}

void EngineTrainer::Train(Run* run) {
  const absl::Time started = absl::Now();
  absl::Time last_log = started;
  train::TrainingSession& session = *run->session;
  for (int64_t s = run->start_step; s < run->steps; ++s) {
    if (run->stop.load()) return;
    const absl::Time begin = absl::Now();
    absl::StatusOr<train::StepResult> result = session.RunStep(Step(s));
    if (!result.ok()) {
      if (run->stop.load() || absl::IsAborted(result.status())) return;
      if (absl::IsUnavailable(result.status())) {
        LOG(WARNING) << "job " << run->job_id << " generation " << run->generation << " step "
                     << s << ": " << result.status()
                     << "; waiting for the coordinator to reconfigure";
        return;
      }
      LOG(ERROR) << "job " << run->job_id << " step " << s << " failed: " << result.status();
      if (options_.on_finished) options_.on_finished(run->job_id, run->generation, result.status());
      return;
    }
    const double seconds = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - begin));
    const int64_t done = s + 1;
    if (run->loss_log != nullptr) {
      std::fprintf(run->loss_log, "job %s generation %llu step %lld loss %a\n",
                   run->job_id.value().c_str(),
                   static_cast<unsigned long long>(run->generation.value()),
                   static_cast<long long>(done), result->loss);
      std::fflush(run->loss_log);
    }
    if (run->writer != nullptr && (done % run->checkpoint_interval == 0 || done == run->steps)) {
      absl::StatusOr<absl::Duration> stall = run->writer->Save(
          done, checkpoint::StateView{session.model().params(), session.runner().adam_m(),
                                      session.runner().adam_v(), run->optimizer});
      if (!stall.ok()) {
        LOG(WARNING) << "job " << run->job_id << " step " << done
                     << ": checkpoint not taken: " << stall.status();
      } else if (checkpoint_metrics_ != nullptr) {
        checkpoint_metrics_->Saved(*stall);
      }
    }
    {
      absl::MutexLock lock(&progress_mu_);
      progress_.step = Step(done);
      progress_.loss = result->loss;
      progress_.step_time_seconds = seconds;
      progress_.tokens_per_second = static_cast<double>(result->tokens) / seconds;
    }
    if (absl::Now() - last_log >= absl::Seconds(10) || done == run->steps) {
      last_log = absl::Now();
      LOG(INFO) << "job " << run->job_id << " step " << done << "/" << run->steps << " loss "
                << result->loss << " grad norm " << result->grad_norm << " lr "
                << result->learning_rate << " " << static_cast<int64_t>(result->tokens / seconds)
                << " tokens/s";
    }
  }
  if (run->writer != nullptr) {
    // The job completes only once its final checkpoint is in (or failed).
    const checkpoint::UploadResult last = run->writer->Wait();
    if (!last.status.ok()) {
      LOG(WARNING) << "job " << run->job_id << ": the final checkpoint (step " << last.step
                   << ") was not saved: " << last.status;
    }
  }
  LOG(INFO) << "job " << run->job_id << " finished " << run->steps << " steps in "
            << absl::FormatDuration(absl::Trunc(absl::Now() - started, absl::Milliseconds(1)));
  if (options_.on_finished) options_.on_finished(run->job_id, run->generation, absl::OkStatus());
}

void EngineTrainer::Stop() {
  cancelled_ = true;
  absl::MutexLock lock(&mu_);
  StopLocked();
}

void EngineTrainer::StopLocked() {
  if (run_ == nullptr) return;
  run_->stop = true;
  run_->communicators.Abort(absl::AbortedError("trainer stopped"));
  if (run_->thread.joinable()) run_->thread.join();
  run_.reset();
}

TrainingProgress EngineTrainer::progress() const {
  absl::MutexLock lock(&progress_mu_);
  return progress_;
}

}  // namespace cohort::worker
