#pragma once
// WorkerIdentity: which workers a caller may act as. With --tls_client_ca a
// worker RPC comes with a certificate from the cluster CA, and its URI
// subject alternative names say what it may do:
//   cohort://worker/<id>   attach as worker <id>
//   cohort://host/<host>   attach as any worker announcing host <host>
//   cohort://worker/*      attach as any worker (one certificate for a
//                          whole trusted cluster: no binding)
// A certificate without any of these may act as no worker. Without a client
// CA every caller may act as any worker (development on loopback).
//
// The same names bind the job-scoped worker RPCs: KeyValue calls and
// checkpoint uploads of job J generation g are allowed only to a caller that
// may act as a member or donor of that generation (Coordinator::
// CheckParticipant).

#include <string>
#include <string_view>
#include <vector>

namespace cohort::coordinator {

class WorkerIdentity {
 public:
  // Any worker: no client CA, or a wildcard certificate.
  static WorkerIdentity Any() {
    WorkerIdentity identity;
    identity.any_ = true;
    return identity;
  }
  // From a verified certificate's URI SANs; names of other forms are
  // ignored, and malformed cohort:// names are too.
  static WorkerIdentity FromUris(const std::vector<std::string>& uris);

  bool any() const { return any_; }
  bool AllowsWorker(std::string_view worker_id, std::string_view host) const;
  // For errors and logs: "any worker", "workers w1, w2 and host h", or
  // "no worker (...)".
  std::string Describe() const;

 private:
  bool any_ = false;
  std::vector<std::string> workers_;
  std::vector<std::string> hosts_;
};

}  // namespace cohort::coordinator
