#include "coordinator/service/workers_service.h"

#include <deque>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/grpc_status.h"
#include "common/safe_text.h"

namespace cohort::coordinator {
namespace {

class AttachReactor;

// The Coordinator's handle on one stream. It outlives the reactor (the
// Coordinator may hold it a little longer), so it forwards only while the
// reactor is alive.
class StreamSink : public WorkerSink {
 public:
  explicit StreamSink(AttachReactor* reactor) : reactor_(reactor) {}
  void Send(v1::CoordinatorMessage message) override;
  void Close() override;
  void Clear() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  AttachReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

// Lifetime: created by Attach, deletes itself in OnDone. At most one read and
// one write are outstanding; writes queue in `outbox_`.
class AttachReactor : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  AttachReactor(Coordinator* coordinator, std::string peer, StreamLimiter::Lease lease,
                WorkerIdentity identity)
      : coordinator_(coordinator),
        peer_(std::move(peer)),
        lease_(std::move(lease)),
        identity_(std::move(identity)) {
    StartRead(&incoming_);
  }

  void Enqueue(v1::CoordinatorMessage message) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    outbox_.push_back(std::move(message));
    if (!writing_) StartNextWriteLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Client half-closed or the connection broke: either way the worker is
      // gone. Before any Hello it was no worker at all (or what it sent did
      // not parse): not a clean end.
      Lost("stream closed");
      FinishOnce(worker_.has_value()
                     ? grpc::Status::OK
                     : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "the Attach stream ended, or sent a message that does not "
                                    "parse, before its Hello"));
      return;
    }
    absl::Status status = Handle(incoming_);
    if (!status.ok()) {
      LOG(WARNING) << "Attach from " << peer_ << " ("
                   << (worker_ ? worker_->value() : std::string("no hello")) << "): " << status;
      Lost("refused");
      FinishOnce(ToGrpcStatus(status));
      return;
    }
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) return;  // OnReadDone/OnCancel report the broken stream.
    outbox_.pop_front();
    if (!outbox_.empty() && !finished_) StartNextWriteLocked();
  }

  // The same process attached again on a newer stream (Coordinator::Attach).
  void Supersede() {
    FinishOnce(grpc::Status(grpc::StatusCode::ABORTED,
                            "superseded by a newer Attach stream of the same process"));
  }

  void OnCancel() override {
    Lost("stream cancelled");
    FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    Lost("stream done");
    if (sink_) sink_->Clear();
    delete this;
  }

 private:
  absl::Status Handle(const v1::WorkerMessage& message) {
    if (!worker_.has_value()) {
      if (message.kind_case() != v1::WorkerMessage::kHello) {
        return absl::InvalidArgumentError("the first message of an Attach stream must be a Hello");
      }
      const v1::Hello& hello = message.hello();
      if (hello.incarnation() != message.incarnation()) {
        return absl::InvalidArgumentError(
            "WorkerMessage.incarnation differs from Hello.incarnation");
      }
      if (!identity_.AllowsWorker(hello.worker_id(), hello.host())) {
        return absl::PermissionDeniedError(absl::StrCat(
            "hello.worker_id: this client certificate may act as ", identity_.Describe(),
            ", not as worker ", Quoted(hello.worker_id()), " on host ", Quoted(hello.host())));
      }
      sink_ = std::make_shared<StreamSink>(this);
      // Set before Attach: the Welcome may be written from inside it.
      absl::StatusOr<v1::Welcome> welcome = coordinator_->Attach(hello, sink_);
      if (!welcome.ok()) {
        sink_->Clear();
        return welcome.status();
      }
      worker_ = WorkerId(hello.worker_id());
      incarnation_ = Incarnation(hello.incarnation());
      return absl::OkStatus();
    }
    absl::Status status = coordinator_->OnWorkerMessage(*worker_, message, sink_.get());
    // A stale generation in a status is the worker's problem, not the stream's.
    if (status.code() == absl::StatusCode::kAborted &&
        message.kind_case() == v1::WorkerMessage::kStatus) {
      LOG(INFO) << "worker " << *worker_ << ": " << status.message();
      return absl::OkStatus();
    }
    if (status.code() == absl::StatusCode::kNotFound) {
      LOG(INFO) << "worker " << *worker_ << ": " << status.message();
      return absl::OkStatus();
    }
    return status;
  }

  void Lost(const char* why) {
    bool first = false;
    {
      absl::MutexLock lock(&mu_);
      first = !lost_reported_ && worker_.has_value();
      lost_reported_ = true;
    }
    if (first) {
      LOG(DEBUG) << "worker " << *worker_ << ": " << why;
      coordinator_->Detach(*worker_, incarnation_, sink_.get());
    }
  }

  void FinishOnce(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    StartWrite(&outbox_.front());
  }

  Coordinator* coordinator_;
  const std::string peer_;
  StreamLimiter::Lease lease_;  // this client's stream slot
  const WorkerIdentity identity_;  // who the client certificate may act as
  v1::WorkerMessage incoming_;
  // Written only from OnReadDone, which never runs concurrently with itself.
  std::optional<WorkerId> worker_;
  Incarnation incarnation_;
  std::shared_ptr<StreamSink> sink_;

  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> outbox_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_reported_ ABSL_GUARDED_BY(mu_) = false;
};

void StreamSink::Send(v1::CoordinatorMessage message) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Enqueue(std::move(message));
}

void StreamSink::Close() {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Supersede();
}

}  // namespace

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* WorkersService::Attach(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<StreamLimiter::Lease> lease =
      gate_->AdmitStream(*context, "Workers.Attach", Access::kWorker);
  if (!lease.ok()) {
    return new RejectedBidi<v1::WorkerMessage, v1::CoordinatorMessage>(lease.status());
  }
  return new AttachReactor(coordinator_, context->peer(), *std::move(lease),
                           gate_->IdentityOf(*context));
}

grpc::ServerUnaryReactor* WorkersService::List(grpc::CallbackServerContext* context,
                                               const v1::ListWorkersRequest* request,
                                               v1::ListWorkersResponse* response) {
  const absl::Time start = absl::Now();
  if (absl::Status admitted = gate_->Admit(*context, "Workers.List", Access::kRead);
      !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  absl::StatusOr<v1::ListWorkersResponse> page = coordinator_->ListWorkersPage(*request);
  if (page.ok()) *response = *std::move(page);
  metrics_->ObserveRpc("Workers.List", StatusCodeLabel(page.status()), absl::Now() - start);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(page.status()));
  return reactor;
}

grpc::ServerUnaryReactor* WorkersService::Drain(grpc::CallbackServerContext* context,
                                                const v1::DrainWorkerRequest* request,
                                                v1::WorkerInfo* response) {
  const absl::Time start = absl::Now();
  if (absl::Status admitted = gate_->Admit(*context, "Workers.Drain", Access::kAdmin);
      !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  absl::StatusOr<v1::WorkerInfo> info =
      coordinator_->DrainWorker(WorkerId(request->worker_id()), request->reason());
  if (info.ok()) *response = *std::move(info);
  metrics_->ObserveRpc("Workers.Drain", StatusCodeLabel(info.status()),
                       absl::Now() - start);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(info.status()));
  return reactor;
}

}  // namespace cohort::coordinator
