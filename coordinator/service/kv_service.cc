#include "coordinator/service/kv_service.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace cohort::coordinator {
namespace {

absl::StatusOr<KvScope> ParseScope(const v1::KvScope& scope) {
  if (scope.job_id().empty()) return absl::InvalidArgumentError("scope.job_id: must not be empty");
  if (scope.generation() == 0) {
    return absl::InvalidArgumentError("scope.generation: must be a job generation (>= 1)");
  }
  return KvScope{JobId(scope.job_id()), Generation(scope.generation())};
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     CoordinatorMetrics* metrics, const char* method,
                                     absl::Time start, const absl::Status& status) {
  metrics->ObserveRpc(method, StatusCodeLabel(status), absl::Now() - start);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// One KeyValue.WaitFor call. It finishes only from the Coordinator's
// callback, which runs exactly once: with the value, at the deadline, when
// the generation ends, or (the caller went away) at once with Cancelled, so
// a cancelled wait frees its stream slot and its waiter immediately, and
// nothing can call into the reactor after OnDone.
class WaitForReactor : public grpc::ServerUnaryReactor {
 public:
  WaitForReactor(Coordinator* coordinator, CoordinatorMetrics* metrics, KvScope scope,
                 std::string key, v1::GetResponse* response, StreamLimiter::Lease lease,
                 absl::Time start)
      : coordinator_(coordinator),
        metrics_(metrics),
        scope_(std::move(scope)),
        key_(std::move(key)),
        response_(response),
        lease_(std::move(lease)),
        start_(start) {}

  // Registers the wait. The callback may run before KvWaitFor returns, on
  // this thread or another: it is held back until Start is done with the
  // reactor, since finishing lets gRPC delete it.
  void Start(absl::Duration timeout) {
    Coordinator* const coordinator = coordinator_;
    const KvScope scope = scope_;
    const std::string key = key_;
    const uint64_t id = coordinator->KvWaitFor(
        scope, key, timeout, [this](absl::StatusOr<std::string> value) { Complete(std::move(value)); });
    std::optional<absl::StatusOr<std::string>> early;
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      id_ = id;
      started_ = true;
      early = std::move(early_);
      cancel = !early.has_value() && cancelled_ && id != 0;
    }
    if (early.has_value()) return FinishWith(*std::move(early));  // the last use of this
    // Locals only from here: a concurrent completion may finish the call.
    if (cancel) coordinator->KvCancelWait(scope, key, id);
  }

  void OnCancel() override {
    Coordinator* const coordinator = coordinator_;
    const KvScope scope = scope_;
    const std::string key = key_;
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!started_) return;  // Start cancels it
      id = id_;
    }
    if (id != 0) coordinator->KvCancelWait(scope, key, id);
  }

  void OnDone() override { delete this; }

 private:
  void Complete(absl::StatusOr<std::string> value) {
    {
      absl::MutexLock lock(&mu_);
      if (!started_) {
        early_ = std::move(value);
        return;
      }
    }
    FinishWith(std::move(value));
  }

  void FinishWith(absl::StatusOr<std::string> value) {
    if (value.ok()) response_->set_value(*std::move(value));
    metrics_->ObserveRpc("KeyValue.WaitFor", StatusCodeLabel(value.status()),
                         absl::Now() - start_);
    lease_.Release();
    Finish(ToGrpcStatus(value.status()));
  }

  Coordinator* const coordinator_;
  CoordinatorMetrics* const metrics_;
  const KvScope scope_;
  const std::string key_;
  v1::GetResponse* const response_;
  StreamLimiter::Lease lease_;
  const absl::Time start_;
  absl::Mutex mu_;
  uint64_t id_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::StatusOr<std::string>> early_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<KvScope> KeyValueService::Admitted(const grpc::CallbackServerContext& context,
                                                  const v1::KvScope& request) const {
  ASSIGN_OR_RETURN(KvScope scope, ParseScope(request));
  RETURN_IF_ERROR(
      coordinator_->CheckParticipant(gate_->IdentityOf(context), scope.job, scope.generation));
  return scope;
}

grpc::ServerUnaryReactor* KeyValueService::Set(grpc::CallbackServerContext* context,
                                               const v1::SetRequest* request,
                                               v1::SetResponse* response) {
  const absl::Time start = absl::Now();
  if (absl::Status admitted = gate_->Admit(*context, "KeyValue.Set", Access::kWorker);
      !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  absl::StatusOr<KvScope> scope = Admitted(*context, request->scope());
  absl::Status status = scope.ok() ? coordinator_->KvSet(*scope, request->key(), request->value())
                                   : scope.status();
  return FinishWith(context, metrics_, "KeyValue.Set", start, status);
}

grpc::ServerUnaryReactor* KeyValueService::Get(grpc::CallbackServerContext* context,
                                               const v1::GetRequest* request,
                                               v1::GetResponse* response) {
  const absl::Time start = absl::Now();
  if (absl::Status admitted = gate_->Admit(*context, "KeyValue.Get", Access::kWorker);
      !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  absl::StatusOr<KvScope> scope = Admitted(*context, request->scope());
  absl::StatusOr<std::string> value =
      scope.ok() ? coordinator_->KvGet(*scope, request->key()) : scope.status();
  if (value.ok()) response->set_value(*std::move(value));
  return FinishWith(context, metrics_, "KeyValue.Get", start, value.status());
}

grpc::ServerUnaryReactor* KeyValueService::WaitFor(grpc::CallbackServerContext* context,
                                                   const v1::WaitForRequest* request,
                                                   v1::GetResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<StreamLimiter::Lease> lease =
      gate_->AdmitStream(*context, "KeyValue.WaitFor", Access::kWorker);
  if (!lease.ok()) return CallGate::Refuse(context, lease.status());
  absl::StatusOr<KvScope> scope = Admitted(*context, request->scope());
  if (!scope.ok()) return FinishWith(context, metrics_, "KeyValue.WaitFor", start, scope.status());
  auto* reactor = new WaitForReactor(coordinator_, metrics_, *std::move(scope), request->key(),
                                     response, *std::move(lease), start);
  reactor->Start(absl::Milliseconds(request->timeout_ms()));
  return reactor;
}

}  // namespace cohort::coordinator
