#include "coordinator/service/jobs_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/grpc_status.h"
#include "coordinator/service/watch_outbox.h"

namespace cohort::coordinator {
namespace {

absl::Status RequireJobId(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: must not be empty");
  return absl::OkStatus();
}

class WatchReactor;

class WatchSink : public JobEventSink {
 public:
  explicit WatchSink(WatchReactor* reactor) : reactor_(reactor) {}
  void OnEvent(const v1::JobEvent& event) override;
  void OnFinished() override;
  void Clear() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  WatchReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

// Streams events in order; finishes after the terminal event is written or
// when the client goes away. Deletes itself in OnDone.
class WatchReactor : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(Coordinator* coordinator, const std::string& job_id, StreamLimiter::Lease lease)
      : coordinator_(coordinator),
        sink_(std::make_shared<WatchSink>(this)),
        lease_(std::move(lease)) {
    absl::Status valid = RequireJobId(job_id);
    absl::StatusOr<uint64_t> handle =
        valid.ok() ? coordinator_->Watch(JobId(job_id), sink_) : absl::StatusOr<uint64_t>(valid);
    if (!handle.ok()) {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      Finish(ToGrpcStatus(handle.status()));
      return;
    }
    absl::MutexLock lock(&mu_);
    handle_ = *handle;
  }

  void Enqueue(const v1::JobEvent& event) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    switch (outbox_.Add(event)) {
      case WatchOutbox::Added::kStartWrite:
        StartNextWriteLocked();
        return;
      case WatchOutbox::Added::kQueued:
      case WatchOutbox::Added::kCoalesced:
        return;
      case WatchOutbox::Added::kOverflow:
        FinishLocked(grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("this Watch fell ", outbox_.size(), " events (", outbox_.bytes(),
                         " bytes) behind the job; read faster or watch again")));
        return;  // the outbox goes with the reactor (its front may be in a write)
    }
  }

  void EndAfterQueued() {
    absl::MutexLock lock(&mu_);
    ending_ = true;
    if (!writing_) FinishLocked(grpc::Status::OK);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status::CANCELLED);
      return;
    }
    if (outbox_.PopWritten() && !finished_) {
      StartNextWriteLocked();
    } else if (ending_) {
      FinishLocked(grpc::Status::OK);
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    sink_->Clear();
    uint64_t handle;
    {
      absl::MutexLock lock(&mu_);
      handle = handle_;
    }
    if (handle != 0) coordinator_->Unwatch(handle);
    delete this;
  }

 private:
  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    StartWrite(&outbox_.front());
  }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  Coordinator* coordinator_;
  std::shared_ptr<WatchSink> sink_;
  StreamLimiter::Lease lease_;  // this client's stream slot
  absl::Mutex mu_;
  WatchOutbox outbox_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t handle_ ABSL_GUARDED_BY(mu_) = 0;
};

void WatchSink::OnEvent(const v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Enqueue(event);
}

void WatchSink::OnFinished() {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->EndAfterQueued();
}

}  // namespace

template <typename Response>
grpc::ServerUnaryReactor* JobsService::Reply(grpc::CallbackServerContext* context,
                                             const char* method, absl::Time start,
                                             absl::StatusOr<Response> result,
                                             Response* response) {
  if (result.ok()) *response = *std::move(result);
  metrics_->ObserveRpc(method, StatusCodeLabel(result.status()), absl::Now() - start);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* JobsService::Submit(grpc::CallbackServerContext* context,
                                              const v1::SubmitJobRequest* request,
                                              v1::Job* response) {
  if (absl::Status admitted = gate_->Admit(*context, "Jobs.Submit", Access::kAdmin); !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  const absl::Time start = absl::Now();
  return Reply(context, "Jobs.Submit", start, coordinator_->Submit(*request), response);
}

grpc::ServerUnaryReactor* JobsService::Get(grpc::CallbackServerContext* context,
                                           const v1::GetJobRequest* request, v1::Job* response) {
  if (absl::Status admitted = gate_->Admit(*context, "Jobs.Get", Access::kRead); !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  const absl::Time start = absl::Now();
  absl::Status valid = RequireJobId(request->job_id());
  return Reply(context, "Jobs.Get", start,
               valid.ok() ? coordinator_->GetJob(JobId(request->job_id()))
                          : absl::StatusOr<v1::Job>(valid),
               response);
}

grpc::ServerUnaryReactor* JobsService::GetLossHistory(grpc::CallbackServerContext* context,
                                                      const v1::GetLossHistoryRequest* request,
                                                      v1::LossHistory* response) {
  if (absl::Status admitted = gate_->Admit(*context, "Jobs.GetLossHistory", Access::kRead);
      !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  const absl::Time start = absl::Now();
  absl::Status valid = RequireJobId(request->job_id());
  return Reply(context, "Jobs.GetLossHistory", start,
               valid.ok() ? coordinator_->GetLossHistory(JobId(request->job_id()))
                          : absl::StatusOr<v1::LossHistory>(valid),
               response);
}

grpc::ServerUnaryReactor* JobsService::List(grpc::CallbackServerContext* context,
                                            const v1::ListJobsRequest* request,
                                            v1::ListJobsResponse* response) {
  if (absl::Status admitted = gate_->Admit(*context, "Jobs.List", Access::kRead); !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  const absl::Time start = absl::Now();
  return Reply(context, "Jobs.List", start, coordinator_->ListJobsPage(*request), response);
}

grpc::ServerUnaryReactor* JobsService::Cancel(grpc::CallbackServerContext* context,
                                              const v1::CancelJobRequest* request,
                                              v1::Job* response) {
  if (absl::Status admitted = gate_->Admit(*context, "Jobs.Cancel", Access::kAdmin); !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  const absl::Time start = absl::Now();
  absl::Status valid = RequireJobId(request->job_id());
  return Reply(context, "Jobs.Cancel", start,
               valid.ok() ? coordinator_->Cancel(JobId(request->job_id()))
                          : absl::StatusOr<v1::Job>(valid),
               response);
}

grpc::ServerUnaryReactor* JobsService::Delete(grpc::CallbackServerContext* context,
                                              const v1::DeleteJobRequest* request,
                                              v1::DeleteJobResponse* response) {
  if (absl::Status admitted = gate_->Admit(*context, "Jobs.Delete", Access::kAdmin); !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  const absl::Time start = absl::Now();
  absl::Status deleted = coordinator_->DeleteJob(JobId(request->job_id()));
  return Reply(context, "Jobs.Delete", start,
               deleted.ok() ? absl::StatusOr<v1::DeleteJobResponse>(v1::DeleteJobResponse())
                            : absl::StatusOr<v1::DeleteJobResponse>(deleted),
               response);
}

grpc::ServerUnaryReactor* JobsService::Scale(grpc::CallbackServerContext* context,
                                             const v1::ScaleJobRequest* request,
                                             v1::Job* response) {
  if (absl::Status admitted = gate_->Admit(*context, "Jobs.Scale", Access::kAdmin); !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
  const absl::Time start = absl::Now();
  absl::Status valid = RequireJobId(request->job_id());
  return Reply(context, "Jobs.Scale", start,
               valid.ok() ? coordinator_->Scale(*request) : absl::StatusOr<v1::Job>(valid),
               response);
}

grpc::ServerWriteReactor<v1::JobEvent>* JobsService::Watch(grpc::CallbackServerContext* context,
                                                           const v1::WatchJobRequest* request) {
  absl::StatusOr<StreamLimiter::Lease> lease =
      gate_->AdmitStream(*context, "Jobs.Watch", Access::kRead);
  if (!lease.ok()) return new RejectedWriter<v1::JobEvent>(lease.status());
  return new WatchReactor(coordinator_, request->job_id(), *std::move(lease));
}

}  // namespace cohort::coordinator
