#include "worker/engine/ucx_generation_comms.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/comm/mesh_groups.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"
#include "worker/train/mesh_communicators.h"

namespace cohort::worker {
namespace {

// Wraps the bootstrap KvClient so an interrupt during Prepare ends a
// WaitFor within a slice instead of the whole bootstrap timeout.
class CancellableKvClient : public comm::KvClient {
 public:
  CancellableKvClient(std::unique_ptr<comm::KvClient> inner, const std::atomic<bool>* cancelled,
                      const Clock* clock)
      : inner_(std::move(inner)), cancelled_(cancelled), clock_(clock) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (Cancelled()) return CancelledError();
    return inner_->Set(key, value);
  }

  absl::StatusOr<std::string> WaitFor(const std::string& key, absl::Duration timeout) override {
    // The deadline is the clock's; each slice is a real wait of the inner
    // client (a gRPC call or a file poll, which no Clock can drive).
    const absl::Time deadline = clock_->Now() + timeout;
    for (;;) {
      if (Cancelled()) return CancelledError();
      const absl::Duration left = deadline - clock_->Now();
      absl::StatusOr<std::string> value =
          inner_->WaitFor(key, std::clamp(left, absl::ZeroDuration(), kSlice));
      if (!absl::IsDeadlineExceeded(value.status()) || clock_->Now() >= deadline) return value;
    }
  }

 private:
  static constexpr absl::Duration kSlice = absl::Milliseconds(250);
  bool Cancelled() const { return cancelled_ != nullptr && cancelled_->load(); }
  static absl::Status CancelledError() {
    return absl::CancelledError("trainer interrupted while building communicators");
  }
  std::unique_ptr<comm::KvClient> inner_;
  const std::atomic<bool>* cancelled_;
  const Clock* clock_;
};

// Its parts are set by CreateUcxGenerationComms, the one maker.
struct UcxGenerationComms : public GenerationComms {
  train::TrainingGroups groups() const override { return communicators_.groups(); }
  comm::Communicator* world() const override { return world_.get(); }
  void Abort(const absl::Status& reason) override {
    communicators_.Abort(reason);
    if (world_ != nullptr) world_->Abort(reason);
  }

  // Destroyed in reverse: communicators before the context, the context
  // before the KV client it bootstrapped from.
  std::unique_ptr<comm::KvClient> kv_;
  std::unique_ptr<comm::UcxContext> context_;
  train::MeshCommunicators communicators_;
  std::unique_ptr<comm::UcxCommunicator> world_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GenerationComms>> CreateUcxGenerationComms(
    const CommsRequest& request, std::unique_ptr<comm::KvClient> kv,
    absl::Duration bootstrap_timeout, const std::string& net_devices,
    comm::CollectiveAlgorithm data_algorithm) {
  const Assignment& assignment = *request.assignment;
  auto comms = std::make_unique<UcxGenerationComms>();
  comms->kv_ = std::make_unique<CancellableKvClient>(std::move(kv), request.cancelled,
                                                     request.clock);
  comm::UcxContextOptions context;
  context.rank = request.participant;
  context.size = request.participants;
  context.kv = comms->kv_.get();
  // Names the job and generation (the KV scope already separates the keys):
  // shared-memory segment names derive from it, and a held generation's
  // communicators, destroyed after the next generation's are built, must
  // not unlink the new segments of the same name.
  context.key_prefix = absl::StrCat("ucx/", assignment.job_id.value(), "/",
                                    assignment.generation.value(), "/");
  context.bootstrap_timeout = bootstrap_timeout;
  context.cancelled = request.cancelled;
  context.net_devices = net_devices;
  ASSIGN_OR_RETURN(comms->context_, comm::UcxContext::Create(context));
  if (request.mesh_groups) {
    ASSIGN_OR_RETURN(comm::MeshGroups groups,
                     comm::ComputeMeshGroups(assignment.mesh, assignment.coordinates));
    ASSIGN_OR_RETURN(
        comms->communicators_,
        train::CreateMeshCommunicators(comms->context_.get(), context, groups, data_algorithm));
  }
  if (request.world) {
    comm::UcxCommunicatorOptions world;
    world.comm_id = comm::MeshCommunicatorId(comm::MeshAxis::kWorld, 1);
    ASSIGN_OR_RETURN(comms->world_, comm::UcxCommunicator::Create(comms->context_.get(), world));
  }
  return std::unique_ptr<GenerationComms>(std::move(comms));
}

}  // namespace cohort::worker
