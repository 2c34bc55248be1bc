#pragma once
// The protocol of one Workers.Attach stream, message by message, apart from
// gRPC: AttachStreams' calls (service/attach_streams.cc) run it, and the
// coordinator RPC fuzzer drives it directly, so the fuzzer exercises the
// server's own checks rather than a copy of them.
//
// The first message must be a Hello whose incarnation is the message's and
// whose worker the caller's identity may act as; it attaches the worker with
// `sink` (the Welcome and every later command go there). Every later
// message goes to the coordinator as that worker. Errors that are the
// worker's business and not the stream's (an AssignmentStatus of a stale
// generation, a message about a job the coordinator no longer has) are
// logged and answered OK; any other error ends the stream.
//
// Thread-compatible: one stream's messages one at a time.

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"
#include "coordinator/coordinator.h"
#include "coordinator/membership/worker_identity.h"

namespace cohort::coordinator {

struct AttachedWorker {
  WorkerId id;
  Incarnation incarnation;
};

// `attached`: the stream's worker, nullopt until a Hello attaches it (this
// call sets it then). `sink` is what the Hello attaches with; later
// messages pass the same sink. On an error before the worker is attached
// the coordinator holds no reference to `sink`.
absl::Status HandleAttachMessage(Coordinator& coordinator, const WorkerIdentity& identity,
                                 const v1::WorkerMessage& message,
                                 const std::shared_ptr<WorkerSink>& sink,
                                 std::optional<AttachedWorker>& attached);

}  // namespace cohort::coordinator
