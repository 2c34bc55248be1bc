#pragma once
// gRPC glue for cohort.v1.Workers: Attach streams on completion queues of
// their own (AttachStreams, asynchronous API), List and Drain on the callback
// API. Translates messages and calls the Coordinator; all decisions live
// there.

#include "cohort/v1/workers.grpc.pb.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service/attach_streams.h"
#include "coordinator/service/call_gate.h"

namespace cohort::coordinator {

using WorkersServiceBase = v1::Workers::WithAsyncMethod_Attach<v1::Workers::WithCallbackMethod_List<
    v1::Workers::WithCallbackMethod_Drain<v1::Workers::Service>>>;

// Thread-safe. Register it, AddQueues before the server is built, Start
// after; ShutdownStreams after the server's Shutdown.
class WorkersService final : public WorkersServiceBase {
 public:
  WorkersService(Coordinator* coordinator, CoordinatorMetrics* metrics, const CallGate* gate);

  // `queues` completion queues (and threads) for Attach streams.
  void AddQueues(grpc::ServerBuilder* builder, int queues) { attach_.AddQueues(builder, queues); }
  void Start() { attach_.Start(); }
  void ShutdownStreams() { attach_.Shutdown(); }

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
  AttachStreams attach_;
};

}  // namespace cohort::coordinator
