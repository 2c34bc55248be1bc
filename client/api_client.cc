#include "client/api_client.h"

#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace cohort::client {
namespace {

// Payload that marks a status as "no connection" rather than a reply.
constexpr char kUnreachablePayload[] = "type.cohort.dev/cohortctl.Unreachable";

std::string Seconds(absl::Duration d) { return absl::StrFormat("%gs", absl::ToDoubleSeconds(d)); }

}  // namespace

bool IsUnreachable(const absl::Status& status) {
  return status.GetPayload(kUnreachablePayload).has_value();
}

absl::StatusOr<std::unique_ptr<ApiClient>> ApiClient::Create(const ApiClientOptions& options) {
  ASSIGN_OR_RETURN(CoordinatorTarget target, MakeCoordinatorTarget(options.address, options.tls));
  if (!options.token.empty()) {
    if (!target.secure) {
      return absl::InvalidArgumentError(
          "a bearer token (--token_file, $COHORT_TOKEN) needs TLS (--tls_ca): it would cross "
          "the network in plaintext");
    }
    target.credentials = grpc::CompositeChannelCredentials(
        target.credentials, grpc::AccessTokenCredentials(options.token));
  }
  grpc::ChannelArguments args;
  // Checkpoint downloads arrive in messages of several MiB.
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 32 << 20);
  return std::make_unique<ApiClient>(target.NewChannel(args), options);
}

ApiClient::ApiClient(std::shared_ptr<grpc::Channel> channel, ApiClientOptions options)
    : channel_(std::move(channel)),
      options_(std::move(options)),
      jobs_(v1::Jobs::NewStub(channel_)),
      workers_(v1::Workers::NewStub(channel_)),
      checkpoints_(client::NewGrpcCheckpointClient(channel_, /*wait_for_ready=*/false)) {}

absl::Status ApiClient::Classify(const absl::Status& status) const {
  if ((absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) &&
      channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
    return Unreachable(std::string(status.message()));
  }
  return status;
}

absl::Status ApiClient::Unreachable(const std::string& reason) const {
  absl::Status status = absl::UnavailableError(
      absl::StrCat("cannot reach the coordinator at ", options_.address, " (", reason, ")"));
  status.SetPayload(kUnreachablePayload, absl::Cord("1"));
  return status;
}

absl::Status ApiClient::FromGrpc(const grpc::Status& status) const {
  const grpc::StatusCode code = status.error_code();
  // UNAVAILABLE and DEADLINE_EXCEEDED on a channel that is not connected mean
  // the call never reached the coordinator; on a connected channel they are
  // the coordinator's own answer.
  if ((code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) &&
      channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
    return Unreachable(code == grpc::StatusCode::DEADLINE_EXCEEDED
                           ? absl::StrCat("no connection within ", Seconds(options_.timeout))
                           : status.error_message());
  }
  return FromGrpcStatus(status);
}

template <typename Response, typename Call>
absl::StatusOr<Response> ApiClient::Unary(Call call) {
  grpc::ClientContext context;
  context.set_wait_for_ready(false);
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  Response response;
  const grpc::Status status = call(&context, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

absl::StatusOr<v1::Job> ApiClient::Submit(const v1::SubmitJobRequest& request) {
  return Unary<v1::Job>([&](grpc::ClientContext* context, v1::Job* response) {
    return jobs_->Submit(context, request, response);
  });
}

absl::StatusOr<v1::LossHistory> ApiClient::GetLossHistory(const std::string& job_id) {
  v1::GetLossHistoryRequest request;
  request.set_job_id(job_id);
  return Unary<v1::LossHistory>([&](grpc::ClientContext* context, v1::LossHistory* response) {
    return jobs_->GetLossHistory(context, request, response);
  });
}

absl::StatusOr<v1::Job> ApiClient::Get(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::Job>([&](grpc::ClientContext* context, v1::Job* response) {
    return jobs_->Get(context, request, response);
  });
}

// Both lists come in pages (coordinator/paging.h): `call` fetches one for a
// request, and the pages are followed to the end, a bounded number of times.
template <typename Request, typename Response, typename Append>
absl::StatusOr<Response> AllPages(
    Request request, absl::FunctionRef<absl::StatusOr<Response>(const Request&)> call,
    Append append, const char* what) {
  constexpr int kMaxPages = 10000;
  Response all;
  for (int page = 0; page < kMaxPages; ++page) {
    absl::StatusOr<Response> got = call(request);
    if (!got.ok()) return got.status();
    append(*got, &all);
    if (got->next_page_token().empty()) return all;
    request.set_page_token(got->next_page_token());
  }
  return absl::ResourceExhaustedError(absl::StrCat("more than ", kMaxPages, " pages of ", what));
}

absl::StatusOr<v1::ListJobsResponse> ApiClient::List(bool include_finished) {
  v1::ListJobsRequest request;
  request.set_include_finished(include_finished);
  return AllPages<v1::ListJobsRequest, v1::ListJobsResponse>(
      request,
      [&](const v1::ListJobsRequest& page) {
        return Unary<v1::ListJobsResponse>(
            [&](grpc::ClientContext* context, v1::ListJobsResponse* response) {
              return jobs_->List(context, page, response);
            });
      },
      [](v1::ListJobsResponse& got, v1::ListJobsResponse* all) {
        for (v1::Job& job : *got.mutable_jobs()) *all->add_jobs() = std::move(job);
      },
      "jobs");
}

absl::StatusOr<v1::Job> ApiClient::Cancel(const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::Job>([&](grpc::ClientContext* context, v1::Job* response) {
    return jobs_->Cancel(context, request, response);
  });
}

absl::Status ApiClient::Delete(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::DeleteJobResponse>(
             [&](grpc::ClientContext* context, v1::DeleteJobResponse* response) {
               return jobs_->Delete(context, request, response);
             })
      .status();
}

absl::StatusOr<v1::Job> ApiClient::Scale(const v1::ScaleJobRequest& request) {
  return Unary<v1::Job>([&](grpc::ClientContext* context, v1::Job* response) {
    return jobs_->Scale(context, request, response);
  });
}

absl::StatusOr<v1::ListWorkersResponse> ApiClient::ListWorkers() {
  return AllPages<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      v1::ListWorkersRequest(),
      [&](const v1::ListWorkersRequest& page) {
        return Unary<v1::ListWorkersResponse>(
            [&](grpc::ClientContext* context, v1::ListWorkersResponse* response) {
              return workers_->List(context, page, response);
            });
      },
      [](v1::ListWorkersResponse& got, v1::ListWorkersResponse* all) {
        for (v1::WorkerInfo& worker : *got.mutable_workers()) *all->add_workers() = std::move(worker);
      },
      "workers");
}

absl::StatusOr<v1::WorkerInfo> ApiClient::Drain(const std::string& worker_id,
                                                const std::string& reason) {
  v1::DrainWorkerRequest request;
  request.set_worker_id(worker_id);
  request.set_reason(reason);
  return Unary<v1::WorkerInfo>([&](grpc::ClientContext* context, v1::WorkerInfo* response) {
    return workers_->Drain(context, request, response);
  });
}

absl::Status ApiClient::Watch(const std::string& job_id,
                              absl::FunctionRef<bool(const v1::JobEvent&)> on_event) {
  // The stream itself has no deadline, so bound the connection attempt here:
  // wait while the channel is idle or connecting. A refused connection
  // (TRANSIENT_FAILURE) falls through and fails the call at once with
  // gRPC's reason.
  const absl::Time deadline = absl::Now() + options_.timeout;
  grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
  while (state == GRPC_CHANNEL_IDLE || state == GRPC_CHANNEL_CONNECTING) {
    if (!channel_->WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      return Unreachable(absl::StrCat("no connection within ", Seconds(options_.timeout)));
    }
    state = channel_->GetState(/*try_to_connect=*/true);
  }

  grpc::ClientContext context;
  context.set_wait_for_ready(false);
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = jobs_->Watch(&context, request);
  v1::JobEvent event;
  bool stopped = false;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      stopped = true;
      context.TryCancel();
      while (reader->Read(&event)) {
      }  // drain what is in flight before Finish
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  if (stopped || status.ok()) return absl::OkStatus();
  return FromGrpc(status);
}

}  // namespace cohort::client
