#include "worker/engine/state_restorer.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/state_transfer.h"

namespace cohort::worker {
namespace {

// Chunks of a state transfer: 16 Mi floats (64 MiB) at most. Fewer, larger
// rounds: each round is a rendezvous of every participant.
constexpr int64_t kTransferElements = 16 << 20;

std::string Millis(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

}  // namespace

StateRestorer::StateRestorer(const EngineTrainerOptions& options,
                             checkpoint::CheckpointMetrics* metrics)
    : options_(options), metrics_(metrics) {}

absl::StatusOr<RestoredState> StateRestorer::Restore(const Assignment& assignment,
                                                     GenerationRun* run,
                                                     GenerationRun* source) const {
  const v1::RecoveryPlan& plan = assignment.recovery;
  if (plan.kind() != v1::RECOVERY_KIND_PEER) {
    return RestoreFromCheckpoint(assignment, run,
                                 plan.kind() == v1::RECOVERY_KIND_CHECKPOINT
                                     ? std::optional<int64_t>(plan.checkpoint_step())
                                     : std::nullopt);
  }
  const Clock& clock = *options_.clock;
  const absl::Time start = clock.Now();
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
  const model::GptConfig& model =
      run->session != nullptr ? run->session->config().model : source->session->config().model;
  const std::vector<checkpoint::Transfer> transfers =
      checkpoint::PlanTransfers(model, plan, run->layout, kTransferElements);
  const std::vector<std::vector<int>> rounds = checkpoint::ScheduleRounds(transfers);
  checkpoint::TransferStats stats;
  comm::Communicator* world = run->comms != nullptr ? run->comms->world() : nullptr;
  if (world == nullptr && run->participants > 1) {
    return absl::InternalError("a peer recovery without a transfer communicator");
  }
  RETURN_IF_ERROR(checkpoint::RunTransfers(
      world, run->participant, transfers, rounds, serving ? &*serving : nullptr,
      destination ? &*destination : nullptr, options_.collective_timeout, &stats));
  if (metrics_ != nullptr) {
    metrics_->PeerTransferred(stats.sent_bytes, stats.received_bytes, clock.Now() - start);
  }
  LOG(INFO) << "job " << assignment.job_id << " generation " << assignment.generation
            << (run->session != nullptr ? " resumes" : " donated") << " at step " << plan.step()
            << " from peers (generation " << plan.source_generation() << "'s memory): received "
            << stats.received_bytes << " bytes, sent " << stats.sent_bytes << ", copied "
            << stats.copied_bytes << " locally, " << stats.rounds << " rounds in "
            << Millis(clock.Now() - start);
  return RestoredState{plan.step(), static_cast<uint64_t>(stats.received_bytes)};
}

absl::StatusOr<RestoredState> StateRestorer::RestoreFromCheckpoint(
    const Assignment& assignment, GenerationRun* run, std::optional<int64_t> step) const {
  const v1::CheckpointPolicy& policy = assignment.spec.checkpoint();
  const Clock& clock = *options_.clock;
  absl::StatusOr<v1::CheckpointManifest> manifest = run->checkpoints->GetManifest(
      assignment.job_id.value(), step.value_or(-1), options_.checkpoint_timeout);
  if (absl::IsNotFound(manifest.status()) && step.has_value()) {
    // Retention may have replaced it meanwhile: take the newest.
    manifest =
        run->checkpoints->GetManifest(assignment.job_id.value(), -1, options_.checkpoint_timeout);
  }
  if (absl::IsNotFound(manifest.status()) && !policy.resume_from_job().empty()) {
    const int64_t from = policy.resume_from_step() > 0 ? policy.resume_from_step() : -1;
    manifest =
        run->checkpoints->GetManifest(policy.resume_from_job(), from, options_.checkpoint_timeout);
    if (absl::IsNotFound(manifest.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint.resume_from_job: ", manifest.status().message()));
    }
  }
  if (absl::IsNotFound(manifest.status())) {  // nothing to resume from: a fresh start
    if (policy.init_from().empty()) {
      run->session->InitializeParameters();
      return RestoredState{0, 0};
    }
    const absl::Time start = clock.Now();
    absl::Status loaded = run->session->InitializeFromFile(policy.init_from());
    if (!loaded.ok()) {
      // Not a transient failure: every retry would read the same file.
      return absl::FailedPreconditionError(loaded.message());
    }
    LOG(INFO) << "job " << assignment.job_id << " starts from the weights in " << policy.init_from()
              << " (" << Millis(clock.Now() - start) << ")";
    return RestoredState{0, 0};
  }
  if (!manifest.ok()) {
    return absl::Status(
        manifest.status().code(),
        absl::StrCat("looking for a checkpoint to resume from: ", manifest.status().message()));
  }
  train::TrainingSession& session = *run->session;
  const absl::Time start = clock.Now();
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
  RETURN_IF_ERROR(checkpoint::LoadCheckpoint(
      run->checkpoints.get(), *manifest, session.config().model, session.model().table(), buffers,
      options_.checkpoint_timeout, &stats, options_.checkpoint_load_streams));
  const absl::Duration downloading = clock.Now() - start;
  if (gather) {
    absl::Status gathered = session.runner().GatherParameters();
    if (!gathered.ok()) {
      return absl::Status(gathered.code(),
                          absl::StrCat("gathering the checkpoint's weights over the data group: ",
                                       gathered.message()));
    }
  }
  const absl::Duration took = clock.Now() - start;
  if (metrics_ != nullptr) metrics_->Restored(stats.bytes, took);
  // The state this rank now holds: its whole weights shard and its moments.
  const uint64_t restored =
      (session.model().num_params() + 2 * (run->optimizer.end - run->optimizer.begin)) *
      sizeof(float);
  const std::string split = gather ? absl::StrCat(" (download ", Millis(downloading), ", gather ",
                                                  Millis(took - downloading), ")")
                                   : "";
  LOG(INFO) << "job " << assignment.job_id << " generation " << assignment.generation
            << " resumes at step " << manifest->step() << " from the checkpoint of job "
            << manifest->job_id() << " (saved by generation " << manifest->generation() << " as ("
            << manifest->layout().data_parallel() << "," << manifest->layout().tensor_parallel()
            << "," << manifest->layout().pipeline_parallel() << ")): " << stats.chunks
            << " chunks, " << stats.bytes << " bytes downloaded"
            << (gather ? " (its data shard of the weights, the rest gathered)" : "") << ", "
            << restored << " bytes restored in " << Millis(took) << split;
  return RestoredState{manifest->step(), stats.bytes};
}

}  // namespace cohort::worker
