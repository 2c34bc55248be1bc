#pragma once
// CallGate: what every coordinator RPC handler passes before it does any
// work: the Authorizer's check and, for long-lived calls, a slot from the
// StreamLimiter. Refusals are counted in cohort_rpc_rejected_total; the
// Rejected* reactors finish a refused streaming call at once.
//
// Thread-safe.

#include "absl/status/statusor.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service/authorizer.h"
#include "coordinator/service/stream_limiter.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace cohort::coordinator {

class CallGate {
 public:
  // All three outlive the gate; none may be null.
  CallGate(const Authorizer* authorizer, StreamLimiter* streams, CoordinatorMetrics* metrics)
      : authorizer_(authorizer), streams_(streams), metrics_(metrics) {}

  // For unary calls.
  absl::Status Admit(const grpc::ServerContextBase& context, const char* method,
                     Access access) const {
    absl::Status status = authorizer_->Check(context, method, access);
    if (!status.ok()) metrics_->RpcRejected(method, StatusCodeLabel(status));
    return status;
  }

  // For long-lived calls: the lease must live as long as the call.
  absl::StatusOr<StreamLimiter::Lease> AdmitStream(const grpc::ServerContextBase& context,
                                                   const char* method, Access access) const {
    RETURN_IF_ERROR(Admit(context, method, access));
    absl::StatusOr<StreamLimiter::Lease> lease = streams_->Acquire(context.peer(), method);
    if (!lease.ok()) metrics_->RpcRejected(method, StatusCodeLabel(lease.status()));
    return lease;
  }

  // Who the caller of an admitted worker RPC may act as.
  WorkerIdentity IdentityOf(const grpc::ServerContextBase& context) const {
    return authorizer_->IdentityOf(context);
  }

  // A unary call finished with `status` (its handler never ran).
  static grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context,
                                          const absl::Status& status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }

 private:
  const Authorizer* authorizer_;
  StreamLimiter* streams_;
  CoordinatorMetrics* metrics_;
};

// Streaming reactors that finish with a refusal at once and delete
// themselves when gRPC is done with them.
template <typename Response>
class RejectedWriter final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit RejectedWriter(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

template <typename Request>
class RejectedReader final : public grpc::ServerReadReactor<Request> {
 public:
  explicit RejectedReader(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace cohort::coordinator
