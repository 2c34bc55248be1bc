#pragma once
// AttachStream: one Workers.Attach call from the worker's side, over the sync
// gRPC client API.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "common/tls_credentials.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace cohort::worker {

// Thread-safe for the way the agent uses it: Write and WritesDone from any
// thread (serialised here), Read from one reader thread, Cancel from any
// thread, Finish once after the reader has seen the end of the stream.
class AttachStream {
 public:
  // Starts the call; failures show up as a false Read/Write and in Finish.
  explicit AttachStream(v1::Workers::StubInterface* stub);

  // False once the stream is broken or half-closed.
  bool Write(const v1::WorkerMessage& message);
  // Half-closes (no more writes); idempotent.
  void WritesDone();
  // False at the end of the stream (closed, broken or cancelled).
  bool Read(v1::CoordinatorMessage* message) { return rw_->Read(message); }
  // Ends the call at once; a blocked Read returns false.
  void Cancel() { context_.TryCancel(); }
  // How the call ended, as an absl::Status with the gRPC code.
  absl::Status Finish();

 private:
  grpc::ClientContext context_;  // constructed before rw_, which uses it
  std::unique_ptr<grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>> rw_;
  absl::Mutex write_mu_;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;
};

// A channel to the coordinator whose own reconnect backoff is short (100 ms
// .. 1 s), so it does not hold back the agent's attach retries: an attach on
// a channel still waiting out its backoff fails at once, and a worker
// holding an assignment must be back within the coordinator's
// --readopt_grace.
std::shared_ptr<grpc::Channel> NewCoordinatorChannel(const CoordinatorTarget& target);

}  // namespace cohort::worker
