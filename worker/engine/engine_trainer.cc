#include "worker/engine/engine_trainer.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/job_spec/defaults.h"
#include "common/layout/mesh_hosts.h"
#include "common/layout/mesh_proto.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/live_transfer.h"
#include "worker/checkpoint/state_transfer.h"
#include "worker/comm/mesh_groups.h"
#include "worker/comm/tracked_communicator.h"
#include "worker/engine/training_loop.h"
#include "worker/engine/ucx_generation_comms.h"
#include "worker/train/mesh_communicators.h"
#include "worker/train/training_session.h"

namespace cohort::worker {
namespace {

// Chunks of a state transfer: 16 Mi floats (64 MiB) at most. Fewer, larger
// rounds: each round is a rendezvous of every participant.
constexpr int64_t kTransferElements = 16 << 20;

// Whether the run may ever need its previous state versions: unless the job
// can never have a peer.
bool KeepsPrevious(const Assignment& assignment) {
  return std::max(assignment.spec.elastic().max_workers(), assignment.mesh.members_size()) > 1;
}

// Opens --loss_log (if set) for appending.
absl::Status OpenLossLog(const std::string& path, std::FILE** file) {
  if (path.empty()) return absl::OkStatus();
  *file = std::fopen(path.c_str(), "a");
  if (*file == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--loss_log ", path, ": cannot open for appending"));
  }
  return absl::OkStatus();
}

// The specs are the same but for the elastic bounds (a session depends on
// everything else).
bool SameTrainingSpec(const v1::JobSpec& a, const v1::JobSpec& b) {
  v1::JobSpec x = a, y = b;
  x.clear_elastic();
  y.clear_elastic();
  return google::protobuf::util::MessageDifferencer::Equals(x, y);
}

// The state layout of `assignment`'s generation.
checkpoint::StateLayout StateLayoutOf(const Assignment& assignment) {
  return checkpoint::StateLayout{layout::ShapeOf(assignment.mesh),
                                 assignment.spec.parallelism().zero1(),
                                 assignment.spec.elastic().optimizer_replicas()};
}

// The engine's view of `assignment`: its spec, with the plan's split of the
// step's micro-batches over the data ranks (Mesh.micro_batches), which the
// coordinator makes and the worker takes.
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

// Where `assignment`'s data group puts its optimizer copies.
layout::CopyRing CopyRingOf(const Assignment& assignment) {
  return layout::CopyRingOf(assignment.mesh, layout::CoordsOf(assignment.coordinates));
}

v1::HeldState HeldAt(Generation generation, int64_t step) {
  v1::HeldState state;
  state.set_generation(generation.value());
  state.set_step(step);
  return state;
}

// What a warm spare reports about `slot` (its place) in `state`.
v1::WarmSpare WarmStatusOf(const Assignment& slot, v1::WarmSpareState state) {
  v1::WarmSpare warm;
  warm.set_job_id(slot.job_id.value());
  warm.set_generation(slot.generation.value());
  warm.set_rank(slot.coordinates.rank());
  warm.set_state(state);
  return warm;
}

}  // namespace

struct EngineTrainer::Run {
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
  bool from_warm = false;    // its session was a warm spare's
  double communicators_seconds = 0;  // of Build: building `comms`
  uint64_t warm_bytes = 0;   // a warm spare's: the session's estimated memory
  std::FILE* loss_log = nullptr;
  std::atomic<bool> stop{false};
  std::atomic<bool> trained{false};  // completed a step in this generation
  // (tokens, seconds) of the newest steps, for the windowed rate.
  std::deque<std::pair<int64_t, double>> rate_window;
  // The source generation's state, kept (EngineTrainer::previous_) until
  // this run trains a step: reported with this run's own when a peer fails
  // first, or the coordinator would not know it survives.
  std::vector<v1::HeldState> kept;
  std::thread thread;

  // What a generation of `assignment` is.
  void Describe(const Assignment& assignment) {
    job_id = assignment.job_id;
    generation = assignment.generation;
    spec = assignment.spec;
    mesh = assignment.mesh;
    coordinates = assignment.coordinates;
    layout = StateLayoutOf(assignment);
    copy_ring = CopyRingOf(assignment);
    participant = assignment.participant;
  }

  void Abort(const absl::Status& reason) {
    if (comms != nullptr) comms->Abort(reason);
  }

  ~Run() {
    stop = true;
    Abort(absl::AbortedError("generation released"));
    if (thread.joinable()) thread.join();
    writer.reset();  // waits for its upload
    if (loss_log != nullptr) std::fclose(loss_log);
  }
};

EngineTrainer::EngineTrainer(EngineTrainerOptions options) : options_(std::move(options)) {
  if (options_.registry != nullptr) {
    checkpoint_metrics_ = std::make_unique<checkpoint::CheckpointMetrics>(options_.registry);
    communication_metrics_ = std::make_unique<CommunicationMetrics>(*options_.registry);
  }
}

EngineTrainer::~EngineTrainer() {
  Stop();
  {
    absl::MutexLock lock(&warm_mu_);
    warm_exit_ = true;
  }
  if (warm_thread_.joinable()) warm_thread_.join();
}

absl::StatusOr<std::unique_ptr<GenerationComms>> EngineTrainer::NewUcxComms(
    const CommsRequest& request) const {
  const Assignment& assignment = *request.assignment;
  const comm::KvScopeRef scope{assignment.job_id.value(), assignment.generation.value()};
  std::unique_ptr<comm::KvClient> kv = options_.kv_factory
                                           ? options_.kv_factory(scope)
                                           : comm::NewCoordinatorKvClient(options_.coordinator, scope);
  return CreateUcxGenerationComms(request, std::move(kv), options_.bootstrap_timeout,
                                  options_.ucx_net_devices, options_.collectives);
}

bool EngineTrainer::CanKeepSession(const Run& source, const Assignment& assignment) {
  if (source.session == nullptr || assignment.donor || source.job_id != assignment.job_id) {
    return false;
  }
  // The same rank in the same layout: every shard, the optimizer range and
  // the rank's share of each batch have the same shapes.
  return StateLayoutOf(assignment) == source.layout &&
         CopyRingOf(assignment) == source.copy_ring &&
         assignment.coordinates.rank() == source.coordinates.rank() &&
         KeepsPrevious(assignment) == source.keep_previous &&
         SameTrainingSpec(assignment.spec, source.spec);
}

bool EngineTrainer::CanReuseSession(const Run& source, const Assignment& assignment) {
  return source.session != nullptr && !assignment.donor && source.job_id == assignment.job_id;
}

absl::Status EngineTrainer::MoveSession(Run* from, Run* to) {
  const train::TrainingGroups inner =
      to->comms != nullptr ? to->comms->groups() : train::TrainingGroups{};
  const std::pair<std::unique_ptr<comm::TrackedCommunicator>*, comm::Communicator*> slots[] = {
      {&from->tracked_data, inner.data},
      {&from->tracked_tensor, inner.tensor},
      {&from->tracked_pipeline, inner.pipeline}};
  for (const auto& [tracked, communicator] : slots) {
    if ((*tracked == nullptr) != (communicator == nullptr)) {
      return absl::InternalError("a kept session's mesh groups differ from the new generation's");
    }
  }
  for (const auto& [tracked, communicator] : slots) {
    if (*tracked != nullptr) RETURN_IF_ERROR((*tracked)->Rebind(communicator));
  }
  to->tracked_data = std::move(from->tracked_data);
  to->tracked_tensor = std::move(from->tracked_tensor);
  to->tracked_pipeline = std::move(from->tracked_pipeline);
  to->session = std::move(from->session);
  to->optimizer = from->optimizer;
  to->keep_previous = from->keep_previous;
  to->steps = from->steps;
  return absl::OkStatus();
}

namespace {

// A warm spare's communicator: the rank and size of its place, attached to
// no generation yet. The session is built over it and never trains on it.
class DetachedCommunicator : public comm::Communicator {
 public:
  DetachedCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduce(void*, size_t, comm::DataType, comm::ReduceOp, absl::Duration) override {
    return Detached();
  }
  absl::Status ReduceScatter(const void*, void*, size_t, comm::DataType, comm::ReduceOp,
                             absl::Duration) override {
    return Detached();
  }
  absl::Status AllGather(const void*, void*, size_t, comm::DataType, absl::Duration) override {
    return Detached();
  }
  absl::Status Broadcast(void*, size_t, comm::DataType, int, absl::Duration) override {
    return Detached();
  }
  absl::Status Send(const void*, size_t, int, uint32_t, absl::Duration) override {
    return Detached();
  }
  absl::Status Recv(void*, size_t, int, uint32_t, absl::Duration) override { return Detached(); }
  absl::Status SendRecv(const void*, size_t, int, void*, size_t, int, uint32_t,
                        absl::Duration) override {
    return Detached();
  }
  absl::Status Barrier(absl::Duration) override { return Detached(); }
  void Abort(const absl::Status&) override {}

 private:
  static absl::Status Detached() {
    return absl::FailedPreconditionError("a warm spare's session is not attached to a generation");
  }
  const int rank_, size_;
};

class DetachedComms : public GenerationComms {
 public:
  // The mesh groups of `coordinates` in `mesh`.
  static absl::StatusOr<std::unique_ptr<DetachedComms>> Create(
      const v1::Mesh& mesh, const v1::MeshCoordinates& coordinates) {
    ASSIGN_OR_RETURN(comm::MeshGroups groups, comm::ComputeMeshGroups(mesh, coordinates));
    auto comms = std::make_unique<DetachedComms>();
    for (auto [group, slot] : {std::pair{&groups.data, &comms->data_},
                               std::pair{&groups.tensor, &comms->tensor_},
                               std::pair{&groups.pipeline, &comms->pipeline_}}) {
      if (group->size() > 1) {
        *slot = std::make_unique<DetachedCommunicator>(group->index, group->size());
      }
    }
    return comms;
  }
  train::TrainingGroups groups() const override {
    return {data_.get(), tensor_.get(), pipeline_.get()};
  }
  comm::Communicator* world() const override { return nullptr; }
  void Abort(const absl::Status&) override {}

 private:
  std::unique_ptr<DetachedCommunicator> data_, tensor_, pipeline_;
};

// The same place's shapes (job, spec, layout, rank): what a warm spare's
// session fits.
// (EngineTrainer::CanKeepSession, between two places).
bool SamePlace(const Assignment& a, const Assignment& b) {
  return a.job_id == b.job_id && a.coordinates.rank() == b.coordinates.rank() &&
         StateLayoutOf(a) == StateLayoutOf(b) && CopyRingOf(a) == CopyRingOf(b) &&
         KeepsPrevious(a) == KeepsPrevious(b) &&
         SameTrainingSpec(a.spec, b.spec);
}

}  // namespace

absl::Status EngineTrainer::BuildSession(const Assignment& assignment, Run* run,
                                         std::optional<uint64_t> memory_bound, Run* reuse) {
  ASSIGN_OR_RETURN(train::TrainingConfig config, TrainingConfigOf(assignment));
  run->steps = config.steps;
  auto track = [this](comm::Communicator* inner, std::unique_ptr<comm::TrackedCommunicator>* slot,
                      MeshGroup group) -> comm::Communicator* {
    if (inner == nullptr) return nullptr;
    *slot = std::make_unique<comm::TrackedCommunicator>(
        inner, &in_collective_,
        communication_metrics_ != nullptr ? communication_metrics_->observer(group) : nullptr);
    return slot->get();
  };
  const train::TrainingGroups inner =
      run->comms != nullptr ? run->comms->groups() : train::TrainingGroups{};
  train::TrainingGroups groups;
  groups.data = track(inner.data, &run->tracked_data, MeshGroup::kData);
  groups.tensor = track(inner.tensor, &run->tracked_tensor, MeshGroup::kTensor);
  groups.pipeline = track(inner.pipeline, &run->tracked_pipeline, MeshGroup::kPipeline);
  const model::ModelLayout layout = train::LayoutOf(assignment.mesh, assignment.coordinates);
  train::TrainingSessionOptions session;
  session.num_threads = options_.num_threads;
  session.device_index = options_.device_index;
  session.collective_timeout = options_.collective_timeout;
  // Keep what a peer recovery needs, unless the job can never have a peer.
  run->keep_previous = KeepsPrevious(assignment);
  session.state_versions.keep_previous = run->keep_previous;
  session.state_versions.optimizer_replicas = run->layout.optimizer_replicas;
  session.state_versions.copy_ring = run->copy_ring;
  // Restore overwrites every weight (or fails); the initial draw happens
  // only when there is nothing to restore (RestoreFromCheckpoint).
  session.initialize_parameters = false;
  session.reuse = reuse != nullptr ? reuse->session.get() : nullptr;
  if (memory_bound.has_value()) {
    // Bounded before anything is allocated.
    const int dp_rank = inner.data != nullptr ? inner.data->rank() : 0;
    ASSIGN_OR_RETURN(const uint64_t bytes,
                     train::TrainingSession::EstimateBytes(config, layout, run->layout.shape.data,
                                                           dp_rank, session));
    if (bytes > *memory_bound) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the session takes ", bytes, " bytes, more than --warm_spare_memory ", *memory_bound));
    }
    run->warm_bytes = bytes;
  }
  ASSIGN_OR_RETURN(run->session, train::TrainingSession::Create(config, layout, groups, session));
  const train::DataParallel& dp = run->session->data_parallel();
  run->optimizer = {dp.update_begin(), dp.update_end()};
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EngineTrainer::Run>> EngineTrainer::Build(
    const Assignment& assignment, Run* keep, Run* warm, Run* reuse) {
  const v1::Mesh& mesh = assignment.mesh;
  auto run = std::make_unique<Run>();
  run->Describe(assignment);
  const bool peer = assignment.recovery.kind() == v1::RECOVERY_KIND_PEER;
  run->participants = mesh.members_size() + (peer ? assignment.recovery.donors_size() : 0);
  {
    absl::MutexLock lock(&building_mu_);
    building_ = run.get();
  }
  auto unregister = [this] {
    absl::MutexLock lock(&building_mu_);
    building_ = nullptr;
  };
  const absl::Time build_start = absl::Now();
  absl::Status built = [&]() -> absl::Status {
    if (run->participants > 1) {
      CommsRequest request;
      request.assignment = &assignment;
      request.participant = run->participant;
      request.participants = run->participants;
      request.mesh_groups = !assignment.donor && mesh.members_size() > 1;
      request.world = peer;
      request.cancelled = &cancelled_;
      ASSIGN_OR_RETURN(run->comms, options_.comms_factory ? options_.comms_factory(request)
                                                          : NewUcxComms(request));
    }
    run->communicators_seconds = absl::ToDoubleSeconds(absl::Now() - build_start);
    run->checkpoints = options_.checkpoint_factory
                           ? options_.checkpoint_factory()
                           : client::NewGrpcCheckpointClient(options_.coordinator);
    if (assignment.donor) return absl::OkStatus();
    run->checkpoint_interval = assignment.spec.checkpoint().interval_steps();
    RETURN_IF_ERROR(OpenLossLog(options_.loss_log, &run->loss_log));
    if (keep != nullptr) {
      RETURN_IF_ERROR(MoveSession(keep, run.get()));  // the last step that can fail
      run->also_holds = keep->trained ? std::vector<Generation>{} : keep->also_holds;
      run->also_holds.push_back(keep->generation);
      return absl::OkStatus();
    }
    if (warm != nullptr) {
      RETURN_IF_ERROR(MoveSession(warm, run.get()));
      run->from_warm = true;
      return absl::OkStatus();
    }
    return BuildSession(assignment, run.get(), std::nullopt, reuse);
  }();
  unregister();
  if (!built.ok()) return built;
  LOG(INFO) << "job " << assignment.job_id << " generation " << assignment.generation
            << (!run->also_holds.empty() ? ": communicators built, training session kept, in "
                : run->from_warm ? ": communicators built, warm spare's training session taken, in "
                : run->session != nullptr && run->session->reused_model()
                    ? ": communicators and training session built around a model shard it held, in "
                    : ": communicators and training session built in ")
            << absl::FormatDuration(absl::Trunc(absl::Now() - build_start, absl::Milliseconds(1)));
  return run;
}

absl::StatusOr<std::unique_ptr<EngineTrainer::Run>> EngineTrainer::BuildWarm(
    const Assignment& slot) {
  auto run = std::make_unique<Run>();
  run->Describe(slot);
  ASSIGN_OR_RETURN(run->comms, DetachedComms::Create(slot.mesh, slot.coordinates));
  RETURN_IF_ERROR(BuildSession(slot, run.get(), options_.warm_memory_bytes, nullptr));
  run->session->Reserve();
  return run;
}

void EngineTrainer::Warm(const Assignment& slot) {
  absl::MutexLock lock(&warm_mu_);
  if (options_.warm_memory_bytes == 0 && !slot.job_id.value().empty()) {
    warm_status_ = WarmStatusOf(slot, v1::WARM_SPARE_STATE_COLD);
    warm_status_.set_message("preparing ahead is off (--warm_spare_memory 0)");
    return;
  }
  if (slot.job_id.value().empty()) {
    warm_wanted_.reset();
  } else {
    warm_wanted_ = slot;
    // The same place of a newer generation: what was prepared still fits.
    if (warm_done_.has_value() && SamePlace(*warm_done_, slot)) {
      warm_done_ = slot;
      warm_status_.set_generation(slot.generation.value());
    }
  }
  if (!warm_thread_.joinable()) warm_thread_ = std::thread([this] { WarmLoop(); });
}

v1::WarmSpare EngineTrainer::warm_status() const {
  absl::MutexLock lock(&warm_mu_);
  return warm_status_;
}

void EngineTrainer::WarmLoop() {
  auto key = [](const std::optional<Assignment>& a) {
    return a.has_value() ? std::tuple(a->job_id.value(), a->generation.value(),
                                      a->coordinates.rank())
                         : std::tuple(std::string(), uint64_t{0}, -1);
  };
  absl::MutexLock lock(&warm_mu_);
  while (true) {
    auto pending = [&] { return warm_exit_ || key(warm_wanted_) != key(warm_done_); };
    warm_mu_.Await(absl::Condition(&pending));
    if (warm_exit_) return;
    const std::optional<Assignment> target = warm_wanted_;
    std::unique_ptr<Run> drop = std::move(warm_);
    warm_done_ = target;
    warm_busy_ = true;
    warm_status_ = target.has_value() ? WarmStatusOf(*target, v1::WARM_SPARE_STATE_WARMING)
                                      : v1::WarmSpare();
    warm_mu_.Unlock();
    drop.reset();  // its memory goes back before the next session is built
    absl::StatusOr<std::unique_ptr<Run>> built =
        target.has_value() ? BuildWarm(*target) : std::unique_ptr<Run>();
    warm_mu_.Lock();
    warm_busy_ = false;
    if (!target.has_value()) continue;
    if (built.ok()) {
      warm_ = *std::move(built);
      warm_status_.set_state(v1::WARM_SPARE_STATE_WARM);
      warm_status_.set_bytes(warm_->warm_bytes);
      LOG(INFO) << "warm spare of job " << target->job_id << " rank "
                << target->coordinates.rank() << ": session ready (" << warm_->warm_bytes
                << " bytes)";
    } else {
      warm_status_.set_state(v1::WARM_SPARE_STATE_COLD);
      warm_status_.set_message(std::string(built.status().message()));
      LOG(WARNING) << "warm spare of job " << target->job_id << " rank "
                   << target->coordinates.rank() << ": not prepared: " << built.status();
    }
  }
}

std::unique_ptr<EngineTrainer::Run> EngineTrainer::TakeWarm(const Assignment& assignment) {
  std::unique_ptr<Run> taken;
  {
    absl::MutexLock lock(&warm_mu_);
    // A build in flight is this Prepare's head start if it is for its place;
    // otherwise the Prepare waits for its memory to be freed anyway.
    auto settled = [this] { return !warm_busy_; };
    warm_mu_.Await(absl::Condition(&settled));
    taken = std::move(warm_);
    warm_wanted_.reset();
    warm_done_.reset();
    warm_status_.Clear();
  }
  if (taken == nullptr) return nullptr;
  if (CanKeepSession(*taken, assignment)) return taken;
  // Prepared for another place of the same model shard (any data rank of a
  // job without tensor or pipeline parallelism): a session for this place
  // is built around it.
  if (CanReuseSession(*taken, assignment)) {
    absl::StatusOr<train::TrainingConfig> config = TrainingConfigOf(assignment);
    if (config.ok() && taken->session->ModelFitsFor(
                           *config, train::LayoutOf(assignment.mesh, assignment.coordinates))) {
      return taken;
    }
  }
  return nullptr;  // released: its memory is freed before the Prepare builds
}

absl::StatusOr<int64_t> EngineTrainer::RestoreFromCheckpoint(const Assignment& assignment,
                                                             Run* run,
                                                             std::optional<int64_t> step) {
  const v1::CheckpointPolicy& policy = assignment.spec.checkpoint();
  absl::StatusOr<v1::CheckpointManifest> manifest = run->checkpoints->GetManifest(
      assignment.job_id.value(), step.value_or(-1), options_.checkpoint_timeout);
  if (absl::IsNotFound(manifest.status()) && step.has_value()) {
    // Retention may have replaced it meanwhile: take the newest.
    manifest = run->checkpoints->GetManifest(assignment.job_id.value(), -1,
                                             options_.checkpoint_timeout);
  }
  if (absl::IsNotFound(manifest.status()) && !policy.resume_from_job().empty()) {
    const int64_t from = policy.resume_from_step() > 0 ? policy.resume_from_step() : -1;
    manifest = run->checkpoints->GetManifest(policy.resume_from_job(), from,
                                             options_.checkpoint_timeout);
    if (absl::IsNotFound(manifest.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint.resume_from_job: ", manifest.status().message()));
    }
  }
  if (absl::IsNotFound(manifest.status())) {  // nothing to resume from: a fresh start
    if (policy.init_from().empty()) {
      run->session->InitializeParameters();
      return 0;
    }
    const absl::Time start = absl::Now();
    absl::Status loaded = run->session->InitializeFromFile(policy.init_from());
    if (!loaded.ok()) {
      // Not a transient failure: every retry would read the same file.
      return absl::FailedPreconditionError(loaded.message());
    }
    LOG(INFO) << "job " << assignment.job_id << " starts from the weights in "
              << policy.init_from() << " ("
              << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)))
              << ")";
    return 0;
  }
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat("looking for a checkpoint to resume from: ",
                                     manifest.status().message()));
  }
  train::TrainingSession& session = *run->session;
  const absl::Time start = absl::Now();
  // With ZeRO-1 the data ranks of a shard hold the same weights: each
  // downloads its own data shard of them (the range it updates) and the
  // group all-gathers the rest, as after every step, so the coordinator
  // sends each weight once per shard rather than once per data rank.
  const train::DataParallel& data = session.data_parallel();
  const bool gather = data.zero1() && data.dp() > 1;
  checkpoint::StateBuffers buffers{session.model().params(), session.runner().adam_m(),
                                   session.runner().adam_v(), run->optimizer};
  if (gather) buffers.weights = {data.update_begin(), data.update_end()};
  checkpoint::LoadStats stats;
  RETURN_IF_ERROR(checkpoint::LoadCheckpoint(run->checkpoints.get(), *manifest,
                                             session.config().model, session.model().table(),
                                             buffers, options_.checkpoint_timeout, &stats,
                                             options_.checkpoint_load_streams));
  const absl::Duration downloading = absl::Now() - start;
  if (gather) {
    absl::Status gathered = session.runner().GatherParameters();
    if (!gathered.ok()) {
      return absl::Status(gathered.code(),
                          absl::StrCat("gathering the checkpoint's weights over the data group: ",
                                       gathered.message()));
    }
  }
  const absl::Duration took = absl::Now() - start;
  if (checkpoint_metrics_ != nullptr) checkpoint_metrics_->Restored(stats.bytes, took);
  restore_bytes_ = stats.bytes;
  // The state this rank now holds: its whole weights shard and its moments.
  const uint64_t restored =
      (session.model().num_params() + 2 * (run->optimizer.end - run->optimizer.begin)) *
      sizeof(float);
  auto ms = [](absl::Duration d) {
    return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
  };
  const std::string split = gather ? absl::StrCat(" (download ", ms(downloading), ", gather ",
                                                  ms(took - downloading), ")")
                                   : "";
  LOG(INFO) << "job " << assignment.job_id << " generation " << assignment.generation
            << " resumes at step " << manifest->step() << " from the checkpoint of job "
            << manifest->job_id() << " (saved by generation " << manifest->generation() << " as ("
            << manifest->layout().data_parallel() << "," << manifest->layout().tensor_parallel()
            << "," << manifest->layout().pipeline_parallel() << ")): " << stats.chunks
            << " chunks, " << stats.bytes << " bytes downloaded"
            << (gather ? " (its data shard of the weights, the rest gathered)" : "") << ", "
            << restored << " bytes restored in " << ms(took) << split;
  return manifest->step();
}

absl::StatusOr<int64_t> EngineTrainer::Restore(const Assignment& assignment, Run* run,
                                               Run* source) {
  const v1::RecoveryPlan& plan = assignment.recovery;
  if (plan.kind() != v1::RECOVERY_KIND_PEER) {
    return RestoreFromCheckpoint(assignment, run,
                                 plan.kind() == v1::RECOVERY_KIND_CHECKPOINT
                                     ? std::optional<int64_t>(plan.checkpoint_step())
                                     : std::nullopt);
  }
  const absl::Time start = absl::Now();
  // What this worker serves, from its memory of the source generation.
  std::optional<checkpoint::SourceState> serving;
  absl::StatusOr<train::StateVersions::View> held =
      source != nullptr && source->session != nullptr
          ? source->session->runner().versions().Version(plan.step())
          : absl::NotFoundError("no state of the source generation");
  // A plan may resume at a step only some survivors completed (they hold
  // every piece of it): the others serve nothing and only receive. Should
  // the plan still name this worker as a source, the transfer fails for
  // want of what it was to send.
  if (!held.ok() && !absl::IsNotFound(held.status())) return held.status();
  if (held.ok()) {
    const train::StateVersions::View& view = *held;
    checkpoint::SourceState s;
    s.table = &source->session->model().table();
    s.rank = source->coordinates.rank();
    s.layout = source->layout;
    s.params = view.params;
    s.adam_m = view.adam_m;
    s.adam_v = view.adam_v;
    s.optimizer = source->optimizer;
    for (const auto& mirror : view.mirrors) {
      s.mirrors.push_back({mirror.owner, mirror.adam_m, mirror.adam_v, {mirror.begin, mirror.end}});
    }
    serving = std::move(s);
  }
  std::optional<checkpoint::DestinationState> destination;
  if (run->session != nullptr) {
    train::TrainingSession& session = *run->session;
    destination = checkpoint::DestinationState{
        &session.model().table(),
        checkpoint::StateBuffers{session.model().params(), session.runner().adam_m(),
                                 session.runner().adam_v(), run->optimizer}};
  }
  const model::GptConfig& model = run->session != nullptr ? run->session->config().model
                                                          : source->session->config().model;
  const std::vector<checkpoint::Transfer> transfers =
      checkpoint::PlanTransfers(model, plan, run->layout, kTransferElements);
  const std::vector<std::vector<int>> rounds = checkpoint::ScheduleRounds(transfers);
  checkpoint::TransferStats stats;
  comm::Communicator* world = run->comms != nullptr ? run->comms->world() : nullptr;
  if (world == nullptr && run->participants > 1) {
    return absl::InternalError("a peer recovery without a transfer communicator");
  }
  RETURN_IF_ERROR(checkpoint::RunTransfers(world, run->participant, transfers, rounds,
                                           serving ? &*serving : nullptr,
                                           destination ? &*destination : nullptr,
                                           options_.collective_timeout, &stats));
  if (checkpoint_metrics_ != nullptr) {
    checkpoint_metrics_->PeerTransferred(stats.sent_bytes, stats.received_bytes,
                                         absl::Now() - start);
  }
  restore_bytes_ = static_cast<uint64_t>(stats.received_bytes);
  LOG(INFO) << "job " << assignment.job_id << " generation " << assignment.generation
            << (run->session != nullptr ? " resumes" : " donated") << " at step " << plan.step()
            << " from peers (generation " << plan.source_generation() << "'s memory): received "
            << stats.received_bytes << " bytes, sent " << stats.sent_bytes << ", copied "
            << stats.copied_bytes << " locally, " << stats.rounds << " rounds in "
            << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)));
  return plan.step();
}

EngineTrainer::Run* EngineTrainer::HeldRunLocked(uint64_t generation) {
  for (Run* run : {run_.get(), previous_.get()}) {
    if (run == nullptr || run->session == nullptr) continue;
    if (run->generation.value() == generation) return run;
    if (run->trained) continue;
    for (const Generation older : run->also_holds) {
      if (older.value() == generation) return run;
    }
  }
  return nullptr;
}

std::vector<v1::HeldState> EngineTrainer::HeldStatesLocked() const {
  std::vector<v1::HeldState> held;
  for (const Run* run : {run_.get(), previous_.get()}) {
    if (run == nullptr || run->session == nullptr) continue;
    const int64_t newest = run->session->runner().versions().newest();
    if (newest < 0) continue;
    std::vector<Generation> generations = {run->generation};
    if (!run->trained) {
      generations.insert(generations.end(), run->also_holds.begin(), run->also_holds.end());
    }
    for (const Generation generation : generations) held.push_back(HeldAt(generation, newest));
  }
  return held;
}

absl::Status EngineTrainer::Prepare(const Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  SuspendLocked();
  BeginInterruptible(assignment);
  absl::Cleanup end_interruptible = [this] { EndInterruptible(); };
  {
    // Until the state is restored the step is the one it will resume at.
    absl::MutexLock progress_lock(&progress_mu_);
    std::vector<ValidationPoint> validations = std::move(progress_.recent_validations);
    if (validations_job_ != assignment.job_id) validations.clear();
    validations_job_ = assignment.job_id;
    progress_ = TrainingProgress{};
    progress_.step = Step(assignment.recovery.step());
    progress_.recent_validations = std::move(validations);
  }
  // The generation the plan takes state from must stay until this one
  // has trained; everything else can go.
  const v1::RecoveryPlan& plan = assignment.recovery;
  const bool peer = plan.kind() == v1::RECOVERY_KIND_PEER;
  Run* source = peer ? HeldRunLocked(plan.source_generation()) : nullptr;
  Run* keep = source != nullptr && CanKeepSession(*source, assignment) ? source : nullptr;
  const absl::Time prepare_start = absl::Now();
  restore_bytes_ = 0;
  // A warm spare's session for this place, or one whose model shard fits
  // it (or nothing: what was prepared for another is released first).
  std::unique_ptr<Run> warm = TakeWarm(assignment);
  if (keep != nullptr) warm.reset();
  const bool warm_fits = warm != nullptr && CanKeepSession(*warm, assignment);
  // Otherwise a new session takes over what fits of the warm one's or the
  // source's (the model shard when only the data rank or dp changed).
  Run* reuse = nullptr;
  if (keep == nullptr && !warm_fits) {
    if (warm != nullptr) {
      reuse = warm.get();
    } else if (source != nullptr && CanReuseSession(*source, assignment)) {
      reuse = source;
    }
  }
  absl::StatusOr<std::unique_ptr<Run>> built =
      Build(assignment, keep, warm_fits ? warm.get() : nullptr, reuse);
  if (built.ok() && warm != nullptr && reuse == warm.get()) {
    (*built)->from_warm = (*built)->session->reused_model();
  }
  warm.reset();
  const absl::Time built_at = absl::Now();
  if (!built.ok()) return built.status();
  std::unique_ptr<Run> run = *std::move(built);
  {
    absl::MutexLock building(&building_mu_);
    building_ = run.get();
  }
  train::StateVersions& versions = run->session->runner().versions();
  // A session around the source's model shard writes the weights the source
  // generation holds as its current version: unless they already are the
  // plan's step, that generation keeps only its previous version.
  Run* const shares_model =
      reuse != nullptr && reuse == source && run->session->reused_model() ? reuse : nullptr;
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
  absl::StatusOr<int64_t> start = Restore(assignment, run.get(), keep != nullptr ? run.get() : source);
  const absl::Time restored_at = absl::Now();
  absl::Status mirrored;
  if (start.ok()) {
    if (keep == nullptr) {
      versions.SetCurrent(*start);
    } else if (!in_place) {
      versions.EndRestore(*start);
    }
    // The new layout's mirrors, from the restored moments.
    mirrored = versions.ExchangeMirrors(run->session->data_parallel().group(), *start,
                                        options_.collective_timeout, /*only_missing=*/true);
  }
  {
    absl::MutexLock building(&building_mu_);
    building_ = nullptr;
  }
  absl::Status prepared = cancelled_ ? absl::CancelledError("trainer interrupted during Prepare")
                          : !start.ok() ? start.status()
                                        : mirrored;
  if (!prepared.ok()) {
    // The kept session goes back to the generation it came from, with what
    // it still holds: the next plan may recover from it.
    if (keep != nullptr) {
      if (absl::Status back = MoveSession(run.get(), keep); !back.ok()) {
        LOG(ERROR) << "job " << assignment.job_id << ": the kept session is lost: " << back;
      }
    }
    return prepared;
  }
  run->start_step = *start;
  {
    absl::MutexLock progress_lock(&progress_mu_);
    const absl::Time now = absl::Now();
    last_prepare_.set_build_seconds(absl::ToDoubleSeconds(built_at - prepare_start));
    last_prepare_.set_restore_seconds(absl::ToDoubleSeconds(now - built_at));
    last_prepare_.set_communicators_seconds(run->communicators_seconds);
    // The rest of the build: releasing or taking a prepared session, and
    // building one when there was none to keep or take.
    last_prepare_.set_session_seconds(std::max(
        0.0, absl::ToDoubleSeconds(built_at - prepare_start) - run->communicators_seconds));
    last_prepare_.set_transfer_seconds(absl::ToDoubleSeconds(restored_at - built_at));
    last_prepare_.set_mirrors_seconds(absl::ToDoubleSeconds(now - restored_at));
    last_prepare_.set_restore_bytes(restore_bytes_);
    last_prepare_.set_session_kept(keep != nullptr);
    last_prepare_.set_session_warm(run->from_warm);
    last_prepare_.set_model_kept(shares_model != nullptr);
  }
  if (run->loss_log != nullptr) {
    // Steps above this one logged by older generations are superseded: this
    // generation trains them again (docs/operations.md, "Loss log").
    std::fprintf(run->loss_log, "job %s generation %llu resume %lld time %.6f\n",
                 run->job_id.value().c_str(),
                 static_cast<unsigned long long>(run->generation.value()),
                 static_cast<long long>(run->start_step),
                 absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    std::fflush(run->loss_log);
  }
  if (run->checkpoint_interval > 0) {
    checkpoint::CheckpointWriterOptions writer;
    writer.job_id = assignment.job_id.value();
    writer.generation = assignment.generation;
    writer.writer = static_cast<uint32_t>(assignment.coordinates.rank());
    writer.position = checkpoint::PositionOf(run->layout, assignment.coordinates.rank());
    writer.zero1 = run->layout.zero1;
    writer.upload_timeout = options_.checkpoint_timeout;
    if (checkpoint_metrics_ != nullptr) {
      writer.on_result = [metrics = checkpoint_metrics_.get()](
                             const checkpoint::UploadResult& r) { metrics->Uploaded(r); };
    }
    run->writer = std::make_unique<checkpoint::CheckpointWriter>(
        run->checkpoints.get(), run->session->config().model, run->session->model().table(),
        std::move(writer));
  }
  // Keep the source generation (if it is not this one, and kept its own
  // session) until this one has trained a step; drop anything else.
  std::unique_ptr<Run> held;
  if (keep == nullptr && source == run_.get()) held = std::move(run_);
  if (keep == nullptr && source == previous_.get()) held = std::move(previous_);
  run_.reset();
  previous_ = std::move(held);
  run_ = std::move(run);
  // What this run reports as held besides its own state until it trains.
  run_->kept.clear();
  auto add_kept = [this](Generation generation, int64_t step) {
    if (step >= 0) run_->kept.push_back(HeldAt(generation, step));
  };
  if (previous_ != nullptr && previous_->session != nullptr) {
    add_kept(previous_->generation, previous_->session->runner().versions().newest());
  }
  for (const Generation older : run_->also_holds) add_kept(older, versions.newest());
  if (shares_model != nullptr) {
    // Until this run's first step changes the shared weights, the source
    // generation (previous_) still holds them as they are.
    versions.set_on_first_update([older = shares_model, self = run_.get()] {
      older->session->runner().versions().BeginRestore();
      self->kept.clear();
      const int64_t step = older->session->runner().versions().newest();
      if (step >= 0) self->kept.push_back(HeldAt(older->generation, step));
    });
  }
  {
    absl::MutexLock progress_lock(&progress_mu_);
    progress_.step = Step(run_->start_step);
  }
  Run* training = run_.get();
  training->thread = std::thread([this, training] { Train(training); });
  return absl::OkStatus();
}

absl::Status EngineTrainer::Donate(const Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  SuspendLocked();
  BeginInterruptible(assignment);
  absl::Cleanup end_interruptible = [this] { EndInterruptible(); };
  Run* source = HeldRunLocked(assignment.recovery.source_generation());
  absl::Status donated = [&]() -> absl::Status {
    if (assignment.recovery.kind() != v1::RECOVERY_KIND_PEER) return absl::OkStatus();
    if (source == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no state of generation ", assignment.recovery.source_generation(), " to donate"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Run> run, Build(assignment, nullptr, nullptr, nullptr));
    {
      absl::MutexLock building(&building_mu_);
      building_ = run.get();
    }
    absl::StatusOr<int64_t> served = Restore(assignment, run.get(), source);
    {
      absl::MutexLock building(&building_mu_);
      building_ = nullptr;
    }
    return served.status();
  }();
  // A donor keeps nothing once its state is handed over. A donation that
  // failed (interrupted by the next re-plan, a participant gone) keeps the
  // source state: the next plan may still recover from it.
  if (donated.ok()) StopLocked();
  return donated;
}

void EngineTrainer::Train(Run* run) {
  TrainingLoopInput input;
  input.job = run->job_id;
  input.generation = run->generation;
  input.session = run->session.get();
  input.start_step = run->start_step;
  input.steps = run->steps;
  input.writer = run->writer.get();
  input.checkpoint_interval = run->checkpoint_interval;
  input.optimizer = run->optimizer;
  input.loss_log = run->loss_log;
  input.stop = &run->stop;
  TrainingLoopHooks hooks;
  hooks.on_step = [this, run](Step done, const train::StepResult& result, absl::Duration took) {
    const bool first = !run->trained;
    run->trained = true;
    {
      const double seconds = absl::ToDoubleSeconds(took);
      absl::MutexLock lock(&progress_mu_);
      progress_.step = done;
      progress_.loss = result.loss;
      progress_.step_time_seconds = seconds;
      progress_.tokens_per_second = static_cast<double>(result.tokens) / seconds;
      // Tokens over seconds of the window: a slow step weighs by its time.
      run->rate_window.emplace_back(result.tokens, seconds);
      if (run->rate_window.size() > static_cast<size_t>(kRateWindowSteps)) {
        run->rate_window.pop_front();
      }
      double tokens = 0, window_seconds = 0;
      for (const auto& [step_tokens, step_seconds] : run->rate_window) {
        tokens += static_cast<double>(step_tokens);
        window_seconds += step_seconds;
      }
      progress_.tokens_per_second_average = window_seconds > 0 ? tokens / window_seconds : 0;
    }
    // After the progress is set: the callback's report carries it.
    if (first && options_.on_first_step) options_.on_first_step(run->job_id, run->generation);
  };
  hooks.on_validation = [this](Step done, double loss, absl::Duration) {
    absl::MutexLock lock(&progress_mu_);
    std::vector<ValidationPoint>& recent = progress_.recent_validations;
    // A repeat (a generation that resumed where one was due) replaces it.
    if (!recent.empty() && recent.back().step == done) recent.pop_back();
    recent.push_back(ValidationPoint{done, loss});
    if (recent.size() > static_cast<size_t>(kRecentValidations)) recent.erase(recent.begin());
  };
  if (checkpoint_metrics_ != nullptr) {
    hooks.on_checkpoint = [metrics = checkpoint_metrics_.get()](absl::Duration stall) {
      metrics->Saved(stall);
    };
  }
  const TrainingLoopOutcome outcome = RunTrainingLoop(input, hooks);
  switch (outcome.end) {
    case TrainingLoopEnd::kStopped:
      return;
    case TrainingLoopEnd::kPeerLost: {
      if (!options_.on_suspended) return;
      std::vector<v1::HeldState> held;
      if (outcome.newest_state >= 0) {
        held.push_back(HeldAt(run->generation, outcome.newest_state));
      }
      // Until this generation has trained, the source generation's state is
      // held too, or the coordinator would not know it survives.
      if (!run->trained) held.insert(held.end(), run->kept.begin(), run->kept.end());
      options_.on_suspended(run->job_id, run->generation, held, outcome.status);
      return;
    }
    case TrainingLoopEnd::kFailed:
      if (options_.on_finished) options_.on_finished(run->job_id, run->generation, outcome.status);
      return;
    case TrainingLoopEnd::kCompleted:
      if (options_.on_finished) {
        options_.on_finished(run->job_id, run->generation, absl::OkStatus());
      }
      return;
  }
}

std::vector<v1::HeldState> EngineTrainer::Suspend() {
  absl::MutexLock lock(&mu_);
  SuspendLocked();
  return HeldStatesLocked();
}

void EngineTrainer::SuspendLocked() {
  if (run_ == nullptr) return;
  run_->stop = true;
  run_->Abort(absl::AbortedError("trainer suspended"));
  if (run_->thread.joinable()) run_->thread.join();
  // Once the current generation has trained, the older state is obsolete.
  if (run_->trained) previous_.reset();
}

void EngineTrainer::BeginInterruptible(const Assignment& assignment) {
  absl::MutexLock lock(&interrupt_mu_);
  interruptible_ = std::pair(assignment.job_id, assignment.generation);
  for (auto it = interrupted_.begin(); it != interrupted_.end();) {
    if (it->first == assignment.job_id) {
      ++it;
    } else {
      interrupted_.erase(it++);
    }
  }
  auto it = interrupted_.find(assignment.job_id);
  cancelled_ = it != interrupted_.end() && assignment.generation <= it->second;
}

void EngineTrainer::EndInterruptible() {
  absl::MutexLock lock(&interrupt_mu_);
  interruptible_.reset();
}

void EngineTrainer::Interrupt(const JobId& job, Generation generation) {
  {
    absl::MutexLock lock(&interrupt_mu_);
    Generation& newest = interrupted_[job];
    newest = std::max(newest, generation);
    if (!interruptible_.has_value() || interruptible_->first != job ||
        interruptible_->second > generation) {
      return;  // recorded for a Prepare or Donate that has not begun
    }
  }
  InterruptAll();  // it is the one in flight
}

void EngineTrainer::InterruptAll() {
  cancelled_ = true;
  absl::MutexLock lock(&building_mu_);
  if (building_ != nullptr) building_->Abort(absl::CancelledError("trainer interrupted"));
}

void EngineTrainer::Stop() {
  InterruptAll();
  absl::MutexLock lock(&mu_);
  StopLocked();
}

void EngineTrainer::StopLocked() {
  if (run_ != nullptr) {
    run_->stop = true;
    run_->Abort(absl::AbortedError("trainer stopped"));
    if (run_->thread.joinable()) run_->thread.join();
  }
  run_.reset();
  previous_.reset();
}

const float* EngineTrainer::weights_for_testing() {
  absl::MutexLock lock(&mu_);
  return run_ != nullptr && run_->session != nullptr
             ? std::as_const(*run_->session).model().params()
             : nullptr;
}

v1::PreparePhases EngineTrainer::last_prepare() const {
  absl::MutexLock lock(&progress_mu_);
  return last_prepare_;
}

TrainingProgress EngineTrainer::progress() const {
  absl::MutexLock lock(&progress_mu_);
  TrainingProgress progress = progress_;
  progress.waiting_for_peers = in_collective_.load() > 0;
  return progress;
}

}  // namespace cohort::worker
