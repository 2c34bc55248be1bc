#pragma once
// A gRPC client of the coordinator's public API (Jobs, Workers.List,
// Workers.Drain and Checkpoints), as cohortctl and other tools use it. Converts gRPC statuses to
// absl::Status once, here, and tells "the coordinator cannot be reached"
// apart from "the coordinator refused".
//
// Thread-safe: the gRPC stubs are, and the client holds no other state.

#include <memory>
#include <string>

#include "common/tls_credentials.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cohort/v1/jobs.grpc.pb.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "grpcpp/channel.h"
#include "client/checkpoint_client.h"

namespace cohort::client {

struct ApiClientOptions {
  std::string address;  // host:port
  // Deadline of each unary call; also how long Watch waits for a connection.
  absl::Duration timeout = absl::Seconds(10);
  ClientTlsFiles tls;  // empty ca: plaintext
  std::string token;   // bearer token sent with every call; empty: none
};

// True when `status` came from ApiClient and means no connection to the
// coordinator could be made (or it went away), as opposed to an error the
// coordinator returned.
bool IsUnreachable(const absl::Status& status);

class ApiClient {
 public:
  // A channel to options.address, with TLS and the token when given.
  // Connects lazily: an unreachable coordinator shows in the first call.
  // InvalidArgument for unusable TLS files or a token without TLS.
  static absl::StatusOr<std::unique_ptr<ApiClient>> Create(const ApiClientOptions& options);

  ApiClient(std::shared_ptr<grpc::Channel> channel, ApiClientOptions options);

  // Every call returns the coordinator's status code and message on error,
  // or an Unavailable status for which IsUnreachable() is true and whose
  // message reads "cannot reach the coordinator at ADDR (reason)". Calls do
  // not wait for a connection (wait_for_ready is off): a refused connection
  // fails at once, a silent address after `timeout`.
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> Get(const std::string& job_id);
  absl::StatusOr<v1::LossHistory> GetLossHistory(const std::string& job_id);
  absl::StatusOr<v1::ListJobsResponse> List(bool include_finished);
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  absl::Status Delete(const std::string& job_id);
  absl::StatusOr<v1::Job> Scale(const v1::ScaleJobRequest& request);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  // Workers.Drain: the worker as it is after the call (DRAINING). The
  // coordinator answers NOT_FOUND for an unknown worker and
  // FAILED_PRECONDITION for a lost one; draining a draining worker is OK.
  // An empty `reason` lets the coordinator use its default.
  absl::StatusOr<v1::WorkerInfo> Drain(const std::string& worker_id, const std::string& reason);

  // Streams Jobs.Watch, calling `on_event` for each event until it returns
  // false (then the stream is cancelled) or the stream ends. OK when
  // `on_event` stopped it or the server closed it cleanly; the stream has no
  // deadline, but connecting is bounded by `timeout`.
  absl::Status Watch(const std::string& job_id,
                     absl::FunctionRef<bool(const v1::JobEvent&)> on_event);

  // The Checkpoints service over the same channel; its errors go through
  // Classify to tell an unreachable coordinator apart.
  client::CheckpointClient& checkpoints() { return *checkpoints_; }
  // A status from checkpoints(), converted like the calls above.
  absl::Status Classify(const absl::Status& status) const;
  absl::Duration timeout() const { return options_.timeout; }

 private:
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(Call call);

  // Converts a failed call's status; see the contract above.
  absl::Status FromGrpc(const grpc::Status& status) const;
  absl::Status Unreachable(const std::string& reason) const;

  std::shared_ptr<grpc::Channel> channel_;
  ApiClientOptions options_;
  std::unique_ptr<v1::Jobs::Stub> jobs_;
  std::unique_ptr<v1::Workers::Stub> workers_;
  std::unique_ptr<client::CheckpointClient> checkpoints_;
};

}  // namespace cohort::client
