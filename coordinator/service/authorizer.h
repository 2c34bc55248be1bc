#pragma once
// Authorizer: who may call which coordinator RPC.
//
// Two kinds of callers:
//   - workers, identified by a TLS client certificate signed by the cluster
//     CA (--tls_client_ca): Workers.Attach, KeyValue.*, Checkpoints.Upload,
//     and the checkpoint reads a resuming worker needs;
//   - users (cohortctl, any gRPC client), identified by a bearer token from
//     --auth_tokens_file, with role `read` (Get, List, Watch, checkpoint
//     reads) or `admin` (also Submit, Cancel, Scale, Drain, Checkpoints.Delete).
// Each check is enforced only when its material is configured: without a
// client CA anyone may call the worker RPCs, without a tokens file anyone the
// user RPCs (development clusters on loopback). CoordinatorServer refuses
// tokens without TLS, since they would cross the network in plaintext.
//
// Tokens are kept as SHA-256 digests and never logged; a caller is named in
// logs by the token's name from the file.
//
// Thread-safe: immutable after Create.

#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "coordinator/membership/worker_identity.h"
#include "grpcpp/server_context.h"

namespace cohort::coordinator {

// What a method needs; a caller may hold several.
enum class Access {
  kRead,          // user, role read or admin
  kAdmin,         // user, role admin
  kWorker,        // worker certificate
  kWorkerOrRead,  // either (checkpoint reads: resuming workers and exports)
};

enum class Role { kRead, kAdmin };

class Authorizer {
 public:
  struct Options {
    // Worker RPCs need a verified client certificate (the server credentials
    // verify it against --tls_client_ca in the handshake).
    bool require_worker_certificate = false;
    // --auth_tokens_file: lines `ROLE NAME TOKEN` (ROLE read|admin, NAME for
    // logs, TOKEN at least 16 characters with no spaces); '#' starts a
    // comment. Empty: user RPCs need no token.
    std::string tokens_file;
  };

  // InvalidArgument naming the file and line for a malformed line, an
  // unknown role, a short or duplicate token; NotFound / PermissionDenied
  // when the file cannot be read.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(const Options& options);
  // From the tokens file's contents (`source` names it in errors).
  static absl::StatusOr<std::unique_ptr<Authorizer>> FromTokens(bool require_worker_certificate,
                                                                absl::string_view contents,
                                                                const std::string& source);
  // Lets every call through (services tested without credentials).
  static std::unique_ptr<Authorizer> AllowAll() {
    return std::unique_ptr<Authorizer>(new Authorizer());
  }

  // OK, or Unauthenticated (no or unknown credentials) / PermissionDenied
  // (a read token on an admin method), naming `method` and what it needs.
  // `authorization` is the call's "authorization" metadata ("" if absent),
  // `peer_has_certificate` whether TLS verified a client certificate.
  absl::Status Check(absl::string_view method, Access access, absl::string_view authorization,
                     bool peer_has_certificate) const;
  // Check with the metadata and auth context of a server call.
  absl::Status Check(const grpc::ServerContextBase& context, absl::string_view method,
                     Access access) const;

  // Which workers the caller of a worker RPC may act as (worker_identity.h):
  // any without --tls_client_ca, else what its certificate names. Call after
  // Check admitted a kWorker method.
  WorkerIdentity IdentityOf(const grpc::ServerContextBase& context) const;

  bool tokens_required() const { return !tokens_.empty(); }
  bool worker_certificate_required() const { return require_worker_certificate_; }
  int token_count() const { return static_cast<int>(tokens_.size()); }

 private:
  struct TokenInfo {
    Role role;
    std::string name;
  };
  Authorizer() = default;
  absl::Status CheckUser(absl::string_view method, Access access,
                         absl::string_view authorization) const;

  bool require_worker_certificate_ = false;
  // SHA-256 of the token -> who holds it.
  absl::flat_hash_map<std::string, TokenInfo> tokens_;
};

}  // namespace cohort::coordinator
