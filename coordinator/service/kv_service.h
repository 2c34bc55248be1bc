#pragma once
// gRPC glue for cohort.v1.KeyValue (callback API; WaitFor parks the call
// without a thread until the Coordinator completes it).

#include "cohort/v1/kv.grpc.pb.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service/call_gate.h"

namespace cohort::coordinator {

// Thread-safe.
class KeyValueService final : public v1::KeyValue::CallbackService {
 public:
  KeyValueService(Coordinator* coordinator, CoordinatorMetrics* metrics, const CallGate* gate)
      : coordinator_(coordinator), metrics_(metrics), gate_(gate) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* WaitFor(grpc::CallbackServerContext* context,
                                    const v1::WaitForRequest* request,
                                    v1::GetResponse* response) override;

 private:
  // The request's scope, if it parses and the caller may act as one of its
  // generation's participants (PermissionDenied otherwise).
  absl::StatusOr<KvScope> Admitted(const grpc::CallbackServerContext& context,
                                   const v1::KvScope& scope) const;

  Coordinator* coordinator_;
  CoordinatorMetrics* metrics_;
  const CallGate* gate_;
};

}  // namespace cohort::coordinator
