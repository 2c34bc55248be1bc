#include "tests/testing/fake_kv_server.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cohort/v1/kv.grpc.pb.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"

namespace cohort::testing {

// The KeyValue service behind FakeKvServer. Thread-safe.
class FakeKvService final : public v1::KeyValue::Service {
 public:
  explicit FakeKvService(absl::Duration max_wait) : max_wait_(max_wait) {}

  grpc::Status Set(grpc::ServerContext* context, const v1::SetRequest* request,
                   v1::SetResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++set_requests_;
    grpc::Status check = Check(request->scope(), request->key());
    if (!check.ok()) return check;
    values_[{request->scope().job_id(), request->scope().generation(), request->key()}] =
        request->value();
    changed_.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   v1::GetResponse* response) override {
    absl::MutexLock lock(&mu_);
    grpc::Status check = Check(request->scope(), request->key());
    if (!check.ok()) return check;
    auto it =
        values_.find({request->scope().job_id(), request->scope().generation(), request->key()});
    if (it == values_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no key ", request->key()));
    }
    response->set_value(it->second);
    return grpc::Status::OK;
  }

  grpc::Status WaitFor(grpc::ServerContext* context, const v1::WaitForRequest* request,
                       v1::GetResponse* response) override {
    const absl::Duration wait =
        request->timeout_ms() == 0 ? max_wait_
                                   : std::min(max_wait_, absl::Milliseconds(request->timeout_ms()));
    const absl::Time deadline = absl::Now() + wait;
    const Key key{request->scope().job_id(), request->scope().generation(), request->key()};
    absl::MutexLock lock(&mu_);
    ++wait_requests_;
    ++waiting_;
    grpc::Status result;
    while (true) {
      result = Check(request->scope(), request->key());
      if (!result.ok()) break;
      auto it = values_.find(key);
      if (it != values_.end()) {
        response->set_value(it->second);
        break;
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        result = grpc::Status(
            grpc::StatusCode::DEADLINE_EXCEEDED,
            absl::StrCat("key ", request->key(), " not set within ", absl::FormatDuration(wait)));
        break;
      }
      if (context->IsCancelled()) {
        result = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
        break;
      }
      // Wakes on every change; the bounded slice notices client cancellation.
      changed_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(100)));
    }
    --waiting_;
    return result;
  }

  void DropGeneration(const std::string& job_id, uint64_t generation) {
    absl::MutexLock lock(&mu_);
    dropped_.insert({job_id, generation});
    auto it = values_.lower_bound({job_id, generation, ""});
    while (it != values_.end() && std::get<0>(it->first) == job_id &&
           std::get<1>(it->first) == generation) {
      it = values_.erase(it);
    }
    changed_.SignalAll();
  }

  void BeginShutdown() {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    changed_.SignalAll();
  }

  int waiting() const {
    absl::MutexLock lock(&mu_);
    return waiting_;
  }
  int64_t set_requests() const {
    absl::MutexLock lock(&mu_);
    return set_requests_;
  }
  int64_t wait_requests() const {
    absl::MutexLock lock(&mu_);
    return wait_requests_;
  }

 private:
  // (job, generation, key); ordered so that one scope's keys are adjacent.
  using Key = std::tuple<std::string, uint64_t, std::string>;

  grpc::Status Check(const v1::KvScope& scope, const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutting_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down");
    if (scope.job_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "scope.job_id: must not be empty");
    }
    if (scope.generation() == 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "scope.generation: must be a job generation (>= 1)");
    }
    if (key.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "key: empty");
    if (dropped_.contains({scope.job_id(), scope.generation()})) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          absl::StrCat("generation ", scope.generation(), " of job ",
                                       scope.job_id(), " has ended"));
    }
    return grpc::Status::OK;
  }

  const absl::Duration max_wait_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<Key, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, uint64_t>> dropped_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t set_requests_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t wait_requests_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::StatusOr<std::unique_ptr<FakeKvServer>> FakeKvServer::Start() { return Start(Options()); }

absl::StatusOr<std::unique_ptr<FakeKvServer>> FakeKvServer::Start(Options options) {
  auto service = std::make_unique<FakeKvService>(options.max_wait);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("FakeKvServer: cannot listen on ", options.host, ":", options.port));
  }
  auto made = std::unique_ptr<FakeKvServer>(
      new FakeKvServer(std::move(service), std::move(server), port));
  made->host_ = options.host;
  return made;
}

FakeKvServer::FakeKvServer(std::unique_ptr<FakeKvService> service,
                           std::unique_ptr<grpc::Server> server, int port)
    : service_(std::move(service)), server_(std::move(server)), port_(port) {}

FakeKvServer::~FakeKvServer() {
  service_->BeginShutdown();
  // Handlers return within a wait slice once released; the deadline only
  // bounds a stuck one.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server_->Wait();
}

std::string FakeKvServer::address() const { return absl::StrCat(host_, ":", port_); }

void FakeKvServer::DropGeneration(const std::string& job_id, uint64_t generation) {
  service_->DropGeneration(job_id, generation);
}

int FakeKvServer::waiting() const { return service_->waiting(); }
int64_t FakeKvServer::set_requests() const { return service_->set_requests(); }
int64_t FakeKvServer::wait_requests() const { return service_->wait_requests(); }

}  // namespace cohort::testing
