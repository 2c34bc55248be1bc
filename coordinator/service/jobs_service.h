#pragma once
// gRPC glue for cohort.v1.Jobs (callback API). Watch is a ServerWriteReactor
// fed by a JobEventSink; everything else is unary.

#include "cohort/v1/jobs.grpc.pb.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service/call_gate.h"

namespace cohort::coordinator {

// Thread-safe.
class JobsService final : public v1::Jobs::CallbackService {
 public:
  JobsService(Coordinator* coordinator, CoordinatorMetrics* metrics, const CallGate* gate)
      : coordinator_(coordinator), metrics_(metrics), gate_(gate) {}

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* context,
                                   const v1::SubmitJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* context,
                                 const v1::ListJobsRequest* request,
                                 v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const v1::DeleteJobRequest* request,
                                   v1::DeleteJobResponse* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* Watch(grpc::CallbackServerContext* context,
                                                const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* Scale(grpc::CallbackServerContext* context,
                                  const v1::ScaleJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* GetLossHistory(grpc::CallbackServerContext* context,
                                           const v1::GetLossHistoryRequest* request,
                                           v1::LossHistory* response) override;

 private:
  // Finishes a unary call with `result`, recording its latency.
  template <typename Response>
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const char* method,
                                  absl::Time start, absl::StatusOr<Response> result,
                                  Response* response);

  Coordinator* coordinator_;
  CoordinatorMetrics* metrics_;
  const CallGate* gate_;
};

}  // namespace cohort::coordinator
