#include "worker/engine/session_builder.h"

#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/live_transfer.h"
#include "worker/comm/mesh_groups.h"
#include "worker/comm/tracked_communicator.h"
#include "worker/engine/ucx_generation_comms.h"
#include "worker/train/mesh_communicators.h"

namespace cohort::worker {
namespace {

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
    for (auto [group, slot] :
         {std::pair{&groups.data, &comms->data_}, std::pair{&groups.tensor, &comms->tensor_},
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

}  // namespace

SessionBuilder::SessionBuilder(const EngineTrainerOptions& options, InterruptGate* interrupts,
                               checkpoint::CheckpointMetrics* checkpoint_metrics)
    : options_(options),
      interrupts_(interrupts),
      checkpoint_metrics_(checkpoint_metrics),
      watchdog_(comm::CallWatchdogOptions{.grace = options.collective_watchdog_grace,
                                          .clock = options.clock}) {
  if (options_.registry != nullptr) {
    communication_metrics_ = std::make_unique<CommunicationMetrics>(*options_.registry);
  }
}

absl::StatusOr<std::unique_ptr<GenerationComms>> SessionBuilder::NewUcxComms(
    const CommsRequest& request) const {
  const Assignment& assignment = *request.assignment;
  const comm::KvScopeRef scope{assignment.job_id.value(), assignment.generation.value()};
  std::unique_ptr<comm::KvClient> kv =
      options_.kv_factory ? options_.kv_factory(scope)
                          : comm::NewCoordinatorKvClient(options_.coordinator, scope);
  return CreateUcxGenerationComms(request, std::move(kv), options_.bootstrap_timeout,
                                  options_.ucx_net_devices, options_.collectives);
}

bool SessionBuilder::CanKeepSession(const GenerationRun& source, const Assignment& assignment) {
  if (source.session == nullptr || assignment.donor || source.job_id != assignment.job_id) {
    return false;
  }
  // The same rank in the same layout: every shard, the optimizer range and
  // the rank's share of each batch have the same shapes.
  return StateLayoutOf(assignment) == source.layout && CopyRingOf(assignment) == source.copy_ring &&
         assignment.coordinates.rank() == source.coordinates.rank() &&
         KeepsPrevious(assignment) == source.keep_previous &&
         SameTrainingSpec(assignment.spec, source.spec);
}

bool SessionBuilder::CanReuseSession(const GenerationRun& source, const Assignment& assignment) {
  return source.session != nullptr && !assignment.donor && source.job_id == assignment.job_id;
}

absl::Status SessionBuilder::MoveSession(GenerationRun* from, GenerationRun* to) {
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
    if (*tracked == nullptr) continue;
    RETURN_IF_ERROR((*tracked)->Rebind(communicator));
    // An overrun now aborts `to`'s generation.
    (*tracked)->set_abort_domain(&to->watched);
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

bool SessionBuilder::SamePlace(const Assignment& a, const Assignment& b) {
  return a.job_id == b.job_id && a.coordinates.rank() == b.coordinates.rank() &&
         StateLayoutOf(a) == StateLayoutOf(b) && CopyRingOf(a) == CopyRingOf(b) &&
         KeepsPrevious(a) == KeepsPrevious(b) && SameTrainingSpec(a.spec, b.spec);
}

absl::Status SessionBuilder::BuildSession(const Assignment& assignment, GenerationRun* run,
                                          std::optional<uint64_t> memory_bound,
                                          GenerationRun* reuse) {
  ASSIGN_OR_RETURN(train::TrainingConfig config, TrainingConfigOf(assignment));
  run->steps = config.steps;
  auto track = [this, run](comm::Communicator* inner,
                           std::unique_ptr<comm::TrackedCommunicator>* slot,
                           MeshGroup group) -> comm::Communicator* {
    if (inner == nullptr) return nullptr;
    *slot = std::make_unique<comm::TrackedCommunicator>(
        inner, &in_collective_,
        communication_metrics_ != nullptr ? communication_metrics_->observer(group) : nullptr);
    (*slot)->Watch(&watchdog_, MeshGroupName(group), &run->watched);
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
  session.fused_attention = options_.fused_attention;
  session.cuda_graphs = options_.cuda_graphs;
  session.collective_timeout = options_.collective_timeout;
  // A device-resident session then keeps a snapshot buffer for them.
  session.checkpoint_snapshot = assignment.spec.checkpoint().interval_steps() > 0;
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

absl::StatusOr<std::unique_ptr<GenerationRun>> SessionBuilder::Build(const Assignment& assignment,
                                                                     GenerationRun* keep,
                                                                     GenerationRun* warm,
                                                                     GenerationRun* reuse) {
  const v1::Mesh& mesh = assignment.mesh;
  auto run = std::make_unique<GenerationRun>();
  run->Describe(assignment);
  const bool peer = assignment.recovery.kind() == v1::RECOVERY_KIND_PEER;
  run->participants = mesh.members_size() + (peer ? assignment.recovery.donors_size() : 0);
  // An interrupt during the build aborts the communicators being built.
  if (interrupts_ != nullptr) interrupts_->SetBuilding(run.get());
  auto unregister = [this] {
    if (interrupts_ != nullptr) interrupts_->SetBuilding(nullptr);
  };
  const Clock& clock = *options_.clock;
  const absl::Time build_start = clock.Now();
  absl::Status built = [&]() -> absl::Status {
    if (run->participants > 1) {
      CommsRequest request;
      request.assignment = &assignment;
      request.participant = run->participant;
      request.participants = run->participants;
      request.mesh_groups = !assignment.donor && mesh.members_size() > 1;
      request.world = peer;
      request.cancelled = interrupts_ != nullptr ? interrupts_->cancelled_flag() : nullptr;
      request.clock = options_.clock;
      ASSIGN_OR_RETURN(run->comms, options_.comms_factory ? options_.comms_factory(request)
                                                          : NewUcxComms(request));
    }
    run->communicators_seconds = absl::ToDoubleSeconds(clock.Now() - build_start);
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
            << absl::FormatDuration(absl::Trunc(clock.Now() - build_start, absl::Milliseconds(1)));
  return run;
}

absl::StatusOr<std::unique_ptr<GenerationRun>> SessionBuilder::BuildWarm(const Assignment& slot) {
  auto run = std::make_unique<GenerationRun>();
  run->Describe(slot);
  ASSIGN_OR_RETURN(run->comms, DetachedComms::Create(slot.mesh, slot.coordinates));
  RETURN_IF_ERROR(BuildSession(slot, run.get(), options_.warm_memory_bytes, nullptr));
  run->session->Reserve();
  return run;
}

void SessionBuilder::AddCheckpointWriter(const Assignment& assignment, GenerationRun* run) const {
  if (run->checkpoint_interval <= 0) return;
  checkpoint::CheckpointWriterOptions writer;
  writer.job_id = assignment.job_id.value();
  writer.generation = assignment.generation;
  writer.writer = static_cast<uint32_t>(assignment.coordinates.rank());
  writer.position = checkpoint::PositionOf(run->layout, assignment.coordinates.rank());
  writer.zero1 = run->layout.zero1;
  writer.upload_timeout = options_.checkpoint_timeout;
  if (checkpoint_metrics_ != nullptr) {
    writer.on_result = [metrics = checkpoint_metrics_](const checkpoint::UploadResult& r) {
      metrics->Uploaded(r);
    };
  }
  run->writer = std::make_unique<checkpoint::CheckpointWriter>(
      run->checkpoints.get(), run->session->config().model, run->session->model().table(),
      std::move(writer));
}

}  // namespace cohort::worker
