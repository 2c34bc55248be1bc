// The coordinator-backed KvClient: one gRPC stub per client, unary calls.
//
// Retry policy (proto/README.md): Unavailable means the coordinator is
// unreachable for now (restarting, network), so both calls retry it with
// exponential backoff; every other code is final. WaitFor retries within the
// caller's timeout and re-issues the request in slices of at most the
// server's 60 s cap, so callers may wait longer than one request can.
#include "worker/comm/kv_client.h"

#include "common/grpc_status.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cohort/v1/kv.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace cohort::comm {
namespace {

// The server caps one WaitFor at 60 s; asking for more is pointless.
constexpr absl::Duration kMaxWaitPerRequest = absl::Seconds(60);
// Headroom for the gRPC deadline over the server-side wait, so that the
// server's DEADLINE_EXCEEDED (or value) arrives before the client gives up.
constexpr absl::Duration kDeadlineSlack = absl::Seconds(2);
constexpr absl::Duration kMinBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
// How long Set keeps retrying an unreachable coordinator.
constexpr absl::Duration kSetRetryBudget = absl::Seconds(10);
// The deadline of one Set request.
constexpr absl::Duration kSetRequestTimeout = absl::Seconds(5);

std::chrono::system_clock::time_point ToChrono(absl::Time t) { return absl::ToChronoTime(t); }

// Exponential backoff between kMinBackoff and kMaxBackoff. Not thread-safe
// (one per call).
class Backoff {
 public:
  // Sleeps for the next delay, but not past `deadline`.
  void Sleep(absl::Time deadline) {
    absl::SleepFor(std::min(next_, std::max(absl::ZeroDuration(), deadline - absl::Now())));
    next_ = std::min(next_ * 2, kMaxBackoff);
  }

 private:
  absl::Duration next_ = kMinBackoff;
};

// Thread-safe: the stub is, and nothing else changes after construction.
class CoordinatorKvClient final : public KvClient {
 public:
  CoordinatorKvClient(const CoordinatorTarget& target, KvScopeRef scope)
      : target_(target.address), scope_(std::move(scope)) {
    grpc::ChannelArguments args;
    // gRPC's own reconnect backoff grows to minutes by default; keep it in
    // line with ours so a coordinator that comes back is seen at once.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub_ = v1::KeyValue::NewStub(target.NewChannel(args));
    scope_proto_.set_job_id(scope_.job_id);
    scope_proto_.set_generation(scope_.generation);
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    v1::SetRequest request;
    *request.mutable_scope() = scope_proto_;
    request.set_key(key);
    request.set_value(value);
    const absl::Time give_up = absl::Now() + kSetRetryBudget;
    Backoff backoff;
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(ToChrono(absl::Now() + kSetRequestTimeout));
      v1::SetResponse response;
      absl::Status status =
          FromGrpcStatus(stub_->Set(&context, request, &response), Describe("Set", key));
      if (status.code() != absl::StatusCode::kUnavailable || absl::Now() >= give_up) {
        return status;
      }
      backoff.Sleep(give_up);
    }
  }

  absl::StatusOr<std::string> WaitFor(const std::string& key, absl::Duration timeout) override {
    v1::WaitForRequest request;
    *request.mutable_scope() = scope_proto_;
    request.set_key(key);
    const absl::Time deadline = absl::Now() + std::max(timeout, absl::ZeroDuration());
    Backoff backoff;
    absl::Status last_unavailable;
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      // At least 1 ms: 0 would mean "the server's maximum".
      const int64_t wait_ms =
          std::max<int64_t>(1, absl::ToInt64Milliseconds(std::min(left, kMaxWaitPerRequest)));
      request.set_timeout_ms(static_cast<uint32_t>(wait_ms));
      grpc::ClientContext context;
      context.set_deadline(ToChrono(absl::Now() + absl::Milliseconds(wait_ms) + kDeadlineSlack));
      v1::GetResponse response;
      absl::Status status =
          FromGrpcStatus(stub_->WaitFor(&context, request, &response), Describe("WaitFor", key));
      if (status.ok()) return std::move(*response.mutable_value());
      const bool time_left = absl::Now() < deadline;
      if (status.code() == absl::StatusCode::kDeadlineExceeded) {
        // One slice ran out (the server's cap, or our own gRPC deadline).
        if (time_left) continue;
        if (!last_unavailable.ok()) {
          return absl::DeadlineExceededError(
              absl::StrCat(status.message(), " (earlier: ", last_unavailable.message(), ")"));
        }
        return status;
      }
      if (status.code() != absl::StatusCode::kUnavailable) return status;
      last_unavailable = status;
      if (!time_left) {
        return absl::DeadlineExceededError(
            absl::StrCat(Describe("WaitFor", key), ": coordinator unreachable for ",
                         absl::FormatDuration(timeout), "; last error: ", status.message()));
      }
      backoff.Sleep(deadline);
    }
  }

 private:
  std::string Describe(const char* method, const std::string& key) const {
    return absl::StrCat("KeyValue.", method, "(", key, ") at ", target_, " for job ", scope_.job_id,
                        " generation ", scope_.generation);
  }

  const std::string target_;
  const KvScopeRef scope_;
  v1::KvScope scope_proto_;
  std::unique_ptr<v1::KeyValue::Stub> stub_;
};

}  // namespace

std::unique_ptr<KvClient> NewCoordinatorKvClient(const CoordinatorTarget& target,
                                                 KvScopeRef scope) {
  return std::make_unique<CoordinatorKvClient>(target, std::move(scope));
}

}  // namespace cohort::comm
