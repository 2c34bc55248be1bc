#include "worker/agent/attach_stream.h"

#include "common/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace cohort::worker {

AttachStream::AttachStream(v1::Workers::StubInterface* stub) : rw_(stub->Attach(&context_)) {}

bool AttachStream::Write(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  if (writes_done_) return false;
  return rw_->Write(message);
}

void AttachStream::WritesDone() {
  absl::MutexLock lock(&write_mu_);
  if (writes_done_) return;
  writes_done_ = true;
  rw_->WritesDone();
}

absl::Status AttachStream::Finish() {
  return FromGrpcStatus(rw_->Finish());
}

std::shared_ptr<grpc::Channel> NewCoordinatorChannel(const CoordinatorTarget& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return target.NewChannel(args);
}

}  // namespace cohort::worker
