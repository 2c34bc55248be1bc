#include "worker/train/engine_trainer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/comm/mesh_groups.h"
#include "worker/train/mesh_communicators.h"

namespace cohort::train {
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
  std::unique_ptr<comm::KvClient> kv;
  std::unique_ptr<comm::UcxContext> context;
  MeshCommunicators communicators;
  std::unique_ptr<TrainingSession> session;
  std::atomic<bool> stop{false};
  std::thread thread;
};

EngineTrainer::EngineTrainer(EngineTrainerOptions options) : options_(std::move(options)) {}

EngineTrainer::~EngineTrainer() { Stop(); }

absl::StatusOr<std::unique_ptr<EngineTrainer::Run>> EngineTrainer::Build(
    const worker::Assignment& assignment) {
  const v1::Mesh& mesh = assignment.mesh;
  ASSIGN_OR_RETURN(TrainingConfig config,
                   TrainingConfigFromSpec(assignment.spec, std::max(1, mesh.data_parallel())));
  auto run = std::make_unique<Run>();
  run->job_id = assignment.job_id;
  run->generation = assignment.generation;
  run->steps = config.steps;
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
    ASSIGN_OR_RETURN(run->communicators, CreateMeshCommunicators(run->context.get(), groups));
  }
  const model::ModelLayout layout = LayoutOf(mesh, assignment.coordinates);
  TrainingSessionOptions session;
  session.num_threads = options_.num_threads;
  session.collective_timeout = options_.collective_timeout;
  ASSIGN_OR_RETURN(run->session, TrainingSession::Create(config, layout, run->communicators.groups(), session));
  return run;
}

absl::Status EngineTrainer::Prepare(const worker::Assignment& assignment) {
  {
    absl::MutexLock lock(&mu_);
    StopLocked();
    cancelled_ = false;
  }
  {
    absl::MutexLock lock(&progress_mu_);
    progress_ = worker::TrainingProgress{};
  }
  if (assignment.generation.value() > 1) {
    LOG(INFO) << "job " << assignment.job_id << " generation " << assignment.generation
              << " starts from step 0: this engine keeps no checkpoints yet";
  }
  absl::StatusOr<std::unique_ptr<Run>> built = Build(assignment);
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("trainer stopped during Prepare");
  if (!built.ok()) return built.status();
  run_ = std::move(*built);
  Run* run = run_.get();
  run->thread = std::thread([this, run] { Train(run); });
  return absl::OkStatus();
}

void EngineTrainer::Train(Run* run) {
  const absl::Time started = absl::Now();
  absl::Time last_log = started;
  for (int64_t s = 0; s < run->steps; ++s) {
    if (run->stop.load()) return;
    const absl::Time begin = absl::Now();
    absl::StatusOr<StepResult> result = run->session->RunStep(Step(s));
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
    {
      absl::MutexLock lock(&progress_mu_);
      progress_.step = Step(s + 1);
      progress_.loss = result->loss;
      progress_.step_time_seconds = seconds;
      progress_.tokens_per_second = static_cast<double>(result->tokens) / seconds;
    }
    if (absl::Now() - last_log >= absl::Seconds(10) || s + 1 == run->steps) {
      last_log = absl::Now();
      LOG(INFO) << "job " << run->job_id << " step " << s + 1 << "/" << run->steps << " loss "
                << result->loss << " grad norm " << result->grad_norm << " lr "
                << result->learning_rate << " " << static_cast<int64_t>(result->tokens / seconds)
                << " tokens/s";
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

worker::TrainingProgress EngineTrainer::progress() const {
  absl::MutexLock lock(&progress_mu_);
  return progress_;
}

}  // namespace cohort::train
