#pragma once
// StreamLimiter: caps the long-lived calls (Attach, Watch, checkpoint Upload
// and Download, KeyValue.WaitFor) one client may hold open at once, so a
// single misbehaving or hostile client cannot exhaust the coordinator's
// threads and memory. A client is the peer's network address without its
// port (all connections from one host count together). Over the limit a call
// is refused with ResourceExhausted naming the client and the flag.
//
// Thread-safe.

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace cohort::coordinator {

class StreamLimiter {
 public:
  // One held slot; releases it when destroyed. Movable.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    ~Lease() { Release(); }
    void Release();

   private:
    friend class StreamLimiter;
    Lease(StreamLimiter* limiter, std::string client)
        : limiter_(limiter), client_(std::move(client)) {}
    StreamLimiter* limiter_ = nullptr;
    std::string client_;
  };

  // max_per_client <= 0: no limit.
  explicit StreamLimiter(int max_per_client) : max_per_client_(max_per_client) {}

  // `peer` as grpc::ServerContext::peer() gives it ("ipv4:10.0.0.7:51234").
  absl::StatusOr<Lease> Acquire(absl::string_view peer, absl::string_view method);

  // "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7"; "ipv6:[::1]:9" -> "ipv6:[::1]";
  // anything without a port (unix:/path) unchanged.
  static std::string ClientOf(absl::string_view peer);

  int open(absl::string_view client) const;

 private:
  void Release(const std::string& client);

  const int max_per_client_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::coordinator
