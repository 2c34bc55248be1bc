#include "coordinator/attach_protocol.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/safe_text.h"

namespace cohort::coordinator {

absl::Status HandleAttachMessage(Coordinator& coordinator, const WorkerIdentity& identity,
                                 const v1::WorkerMessage& message,
                                 const std::shared_ptr<WorkerSink>& sink,
                                 std::optional<AttachedWorker>& attached) {
  if (!attached.has_value()) {
    if (message.kind_case() != v1::WorkerMessage::kHello) {
      return absl::InvalidArgumentError("the first message of an Attach stream must be a Hello");
    }
    const v1::Hello& hello = message.hello();
    if (hello.incarnation() != message.incarnation()) {
      return absl::InvalidArgumentError("WorkerMessage.incarnation differs from Hello.incarnation");
    }
    if (!identity.AllowsWorker(hello.worker_id(), hello.host())) {
      return absl::PermissionDeniedError(absl::StrCat(
          "hello.worker_id: this client certificate may act as ", identity.Describe(),
          ", not as worker ", Quoted(hello.worker_id()), " on host ", Quoted(hello.host())));
    }
    absl::StatusOr<v1::Welcome> welcome = coordinator.Attach(hello, sink);
    if (!welcome.ok()) return welcome.status();
    attached = AttachedWorker{WorkerId(hello.worker_id()), Incarnation(hello.incarnation())};
    return absl::OkStatus();
  }
  absl::Status status = coordinator.OnWorkerMessage(attached->id, message, sink.get());
  // A stale generation in a status is the worker's problem, not the stream's.
  if ((status.code() == absl::StatusCode::kAborted &&
       message.kind_case() == v1::WorkerMessage::kStatus) ||
      status.code() == absl::StatusCode::kNotFound) {
    LOG(INFO) << "worker " << attached->id << ": " << status.message();
    return absl::OkStatus();
  }
  return status;
}

}  // namespace cohort::coordinator
