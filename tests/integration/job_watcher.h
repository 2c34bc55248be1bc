#pragma once
// JobWatcher: follows Jobs.Watch for one job on a background thread and
// keeps every event, for tests that time what the coordinator saw (failure
// detection, recoveries). Stop() (or the destructor) cancels the stream.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cohort/v1/jobs.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace cohort::testing {

class JobWatcher {
 public:
  JobWatcher(std::shared_ptr<grpc::Channel> channel, std::string job_id)
      : stub_(v1::Jobs::NewStub(channel)), job_id_(std::move(job_id)) {
    thread_ = std::thread([this] { Follow(); });
  }
  ~JobWatcher() { Stop(); }
  JobWatcher(const JobWatcher&) = delete;
  JobWatcher& operator=(const JobWatcher&) = delete;

  void Stop() {
    context_.TryCancel();
    if (thread_.joinable()) thread_.join();
  }

  std::vector<v1::JobEvent> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  void Follow() {
    v1::WatchJobRequest request;
    request.set_job_id(job_id_);
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->Watch(&context_, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      absl::MutexLock lock(&mu_);
      events_.push_back(event);
    }
    reader->Finish();
  }

  std::unique_ptr<v1::Jobs::Stub> stub_;
  const std::string job_id_;
  grpc::ClientContext context_;
  mutable absl::Mutex mu_;
  std::vector<v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace cohort::testing
