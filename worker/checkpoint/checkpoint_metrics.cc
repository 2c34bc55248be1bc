#include "worker/checkpoint/checkpoint_metrics.h"

namespace cohort::checkpoint {
namespace {

prometheus::Histogram::BucketBoundaries Seconds() {
  return {0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
}

}  // namespace

CheckpointMetrics::CheckpointMetrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)) {
  stall_ = &prometheus::BuildHistogram()
                .Name("cohort_worker_checkpoint_stall_seconds")
                .Help("Time the training loop was blocked per checkpoint: waiting for the "
                      "previous upload, then copying the rank's state to host memory")
                .Register(*registry_)
                .Add({}, Seconds());
  upload_seconds_ = &prometheus::BuildHistogram()
                         .Name("cohort_worker_checkpoint_upload_seconds")
                         .Help("Duration of this rank's background checkpoint uploads")
                         .Register(*registry_)
                         .Add({}, Seconds());
  restore_seconds_ = &prometheus::BuildHistogram()
                          .Name("cohort_worker_checkpoint_restore_seconds")
                          .Help("Time to load this rank's state from a checkpoint")
                          .Register(*registry_)
                          .Add({}, Seconds());
  bytes_ = &prometheus::BuildCounter()
                .Name("cohort_worker_checkpoint_bytes_total")
                .Help("Checkpoint bytes this rank uploaded (direction=upload) or downloaded "
                      "(direction=download)")
                .Register(*registry_);
  uploads_ = &prometheus::BuildCounter()
                  .Name("cohort_worker_checkpoint_uploads_total")
                  .Help("This rank's checkpoint uploads by result (ok, failed)")
                  .Register(*registry_);
  restores_ = &prometheus::BuildCounter()
                   .Name("cohort_worker_checkpoint_restores_total")
                   .Help("Times this worker restored its state from a checkpoint")
                   .Register(*registry_)
                   .Add({});
  last_step_ = &prometheus::BuildGauge()
                    .Name("cohort_worker_checkpoint_last_step")
                    .Help("Step of this rank's last successful checkpoint upload")
                    .Register(*registry_)
                    .Add({});
  peer_seconds_ = &prometheus::BuildHistogram()
                       .Name("cohort_worker_peer_transfer_seconds")
                       .Help("Duration of this worker's part of peer recoveries (state sent to "
                             "and received from other workers' memory)")
                       .Register(*registry_)
                       .Add({}, Seconds());
  peer_bytes_ = &prometheus::BuildCounter()
                     .Name("cohort_worker_peer_transfer_bytes_total")
                     .Help("State bytes this worker sent to (direction=sent) and received from "
                           "(direction=received) peers in recoveries")
                     .Register(*registry_);
  peer_restores_ = &prometheus::BuildCounter()
                        .Name("cohort_worker_peer_transfers_total")
                        .Help("Peer recoveries this worker took part in")
                        .Register(*registry_)
                        .Add({});
  for (const char* d : {"upload", "download"}) bytes_->Add({{"direction", d}});
  for (const char* d : {"sent", "received"}) peer_bytes_->Add({{"direction", d}});
  for (const char* r : {"ok", "failed"}) uploads_->Add({{"result", r}});
}

void CheckpointMetrics::Saved(absl::Duration stall) {
  stall_->Observe(absl::ToDoubleSeconds(stall));
}

void CheckpointMetrics::Uploaded(const UploadResult& result) {
  uploads_->Add({{"result", result.status.ok() ? "ok" : "failed"}}).Increment();
  upload_seconds_->Observe(absl::ToDoubleSeconds(result.duration));
  if (result.status.ok()) {
    bytes_->Add({{"direction", "upload"}}).Increment(static_cast<double>(result.bytes));
    last_step_->Set(static_cast<double>(result.step.value()));
  }
}

void CheckpointMetrics::Restored(uint64_t bytes, absl::Duration duration) {
  restores_->Increment();
  restore_seconds_->Observe(absl::ToDoubleSeconds(duration));
  bytes_->Add({{"direction", "download"}}).Increment(static_cast<double>(bytes));
}

void CheckpointMetrics::PeerTransferred(int64_t sent_bytes, int64_t received_bytes,
                                        absl::Duration duration) {
  peer_restores_->Increment();
  peer_seconds_->Observe(absl::ToDoubleSeconds(duration));
  peer_bytes_->Add({{"direction", "sent"}}).Increment(static_cast<double>(sent_bytes));
  peer_bytes_->Add({{"direction", "received"}}).Increment(static_cast<double>(received_bytes));
}

}  // namespace cohort::checkpoint
