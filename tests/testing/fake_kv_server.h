#pragma once
// FakeKvServer: an in-process cohort.v1.KeyValue gRPC server on 127.0.0.1 for
// tests of communicator bootstrap, without a coordinator. Unlike the real
// service it has no notion of a job's current generation: every (job,
// generation) scope is accepted and is its own isolated map, until
// DropGeneration ends it the way a generation change ends it in the
// coordinator (waiters get Aborted, later calls on it too).
//
// Request checks match the real service: an empty job id, generation 0 or an
// empty key is InvalidArgument. WaitFor with timeout_ms 0 waits max_wait.
// While the server shuts down every waiter returns Unavailable.
//
// Thread-safe. The service runs on gRPC's synchronous server: a parked WaitFor
// holds one server thread, which is fine at test scale.

#include <cstdint>
#include <memory>
#include <string>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace cohort::testing {

class FakeKvService;

class FakeKvServer {
 public:
  struct Options {
    // 0 picks a free port; otherwise that port (tests that need a server to
    // appear at a known address later pick one with PickFreePort()).
    int port = 0;
    // The cap on one WaitFor request, like the coordinator's 60 s.
    absl::Duration max_wait = absl::Seconds(60);
    // The address it listens on (e.g. a NetnsHosts gateway, for ranks in
    // network namespaces).
    std::string host = "127.0.0.1";
  };

  // Starts serving. Unavailable if the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<FakeKvServer>> Start();
  static absl::StatusOr<std::unique_ptr<FakeKvServer>> Start(Options options);

  // Releases every waiter (Unavailable) and shuts the server down.
  ~FakeKvServer();
  FakeKvServer(const FakeKvServer&) = delete;
  FakeKvServer& operator=(const FakeKvServer&) = delete;

  // "<host>:<port>".
  std::string address() const;
  int port() const { return port_; }

  // Ends the scope (job, generation): removes its keys, its waiters return
  // Aborted, and every later request on it returns Aborted.
  void DropGeneration(const std::string& job_id, uint64_t generation);

  // WaitFor requests parked right now (for tests that must know a waiter is
  // in place before they act).
  int waiting() const;
  // Requests received since start, by method.
  int64_t set_requests() const;
  int64_t wait_requests() const;

 private:
  FakeKvServer(std::unique_ptr<FakeKvService> service, std::unique_ptr<grpc::Server> server,
               int port);

  std::unique_ptr<FakeKvService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_;
  std::string host_;
};

}  // namespace cohort::testing
