#include "coordinator/service/workers_service.h"

#include "common/grpc_status.h"

namespace cohort::coordinator {

WorkersService::WorkersService(Coordinator* coordinator, CoordinatorMetrics* metrics,
                               const CallGate* gate)
    : coordinator_(coordinator),
      metrics_(metrics),
      gate_(gate),
      attach_(coordinator, gate,
              [this](grpc::ServerContext* context, AttachStreams::Stream* stream,
                     grpc::ServerCompletionQueue* queue,
                     void* tag) { RequestAttach(context, stream, queue, queue, tag); }) {}

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
