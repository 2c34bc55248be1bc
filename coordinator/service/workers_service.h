#pragma once
// gRPC glue for cohort.v1.Workers: one ServerBidiReactor per Attach stream
// (callback API, so thousands of streams need no thread each). Translates
// messages and calls the Coordinator; all decisions live there.

#include "cohort/v1/workers.grpc.pb.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service/call_gate.h"

namespace cohort::coordinator {

// Thread-safe.
class WorkersService final : public v1::Workers::CallbackService {
 public:
  WorkersService(Coordinator* coordinator, CoordinatorMetrics* metrics, const CallGate* gate)
      : coordinator_(coordinator), metrics_(metrics), gate_(gate) {}

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Attach(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* context,
                                 const v1::ListWorkersRequest* request,
                                 v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const v1::DrainWorkerRequest* request,
                                  v1::WorkerInfo* response) override;

 private:
  Coordinator* coordinator_;
  CoordinatorMetrics* metrics_;
  const CallGate* gate_;
};

}  // namespace cohort::coordinator
