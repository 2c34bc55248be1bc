#include "coordinator/service/kv_service.h"

#include "absl/strings/str_cat.h"
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
  auto* reactor = context->DefaultReactor();
  CoordinatorMetrics* metrics = metrics_;
  // The Coordinator calls this exactly once; the reactor stays valid until
  // Finish, and `response` until then too.
  coordinator_->KvWaitFor(*scope, request->key(), absl::Milliseconds(request->timeout_ms()),
                          [reactor, response, metrics, start,
                           lease = std::make_shared<StreamLimiter::Lease>(*std::move(lease))](
                              absl::StatusOr<std::string> value) {
                            if (value.ok()) response->set_value(*std::move(value));
                            metrics->ObserveRpc("KeyValue.WaitFor",
                                                StatusCodeLabel(value.status()),
                                                absl::Now() - start);
                            lease->Release();
                            reactor->Finish(ToGrpcStatus(value.status()));
                          });
  return reactor;
}

}  // namespace cohort::coordinator
