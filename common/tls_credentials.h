#pragma once
// TLS for Cohort's gRPC connections: credentials for the coordinator's port
// and for its clients (workers, cohortctl, cohort-sim), made from PEM files
// named by flags.
//
// Every file is checked before gRPC sees it, so a typo or a mismatched key is
// an error naming the flag and the file at start-up, not a failed handshake
// later: certificates must parse, the key must match its certificate, and a
// certificate outside its validity period is refused. Error messages and logs
// name files, subjects and dates, never file contents.
//
// Thread-safe: pure functions.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace cohort {

// The coordinator's --tls_cert, --tls_key and --tls_client_ca.
struct ServerTlsFiles {
  std::string cert{};  // PEM chain, leaf first; empty: plaintext (no TLS)
  std::string key{};   // PEM private key of `cert`
  // PEM bundle of the cluster CA. Set: clients may present a certificate,
  // which must be signed by it (a certificate from any other CA fails the
  // handshake); whether a call needs one is the Authorizer's business.
  std::string client_ca{};
};

// InvalidArgument naming the flag when only some files are given or a file
// is unreadable, malformed, expired or not yet valid, or the key does not
// match the certificate. Empty `cert` and `key`: insecure credentials.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files);

// A client's --tls_ca, --tls_cert, --tls_key and --tls_server_name.
struct ClientTlsFiles {
  std::string ca{};    // PEM bundle that signed the coordinator's certificate; empty: plaintext
  std::string cert{};  // optional client certificate (workers: signed by the cluster CA)
  std::string key{};   // its private key
  // Name the coordinator's certificate must carry when it differs from the
  // address's host (e.g. connecting by IP). Empty: the address's host.
  std::string server_name{};
};

// How to reach the coordinator: its address and the credentials to use.
// Copyable; the credentials object is shared.
struct CoordinatorTarget {
  std::string address;  // host:port
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // never null
  std::string server_name{};  // ClientTlsFiles::server_name
  bool secure = false;      // TLS (credentials from files) or plaintext

  // Plaintext, for tests and loopback development clusters.
  static CoordinatorTarget Insecure(std::string address);

  // A new channel with `args` plus the server-name override.
  std::shared_ptr<grpc::Channel> NewChannel(grpc::ChannelArguments args) const;
};

// InvalidArgument naming the flag as for MakeServerCredentials; `cert`
// without `key` (or the reverse), or either without `ca`, is an error too.
absl::StatusOr<CoordinatorTarget> MakeCoordinatorTarget(std::string address,
                                                        const ClientTlsFiles& files);

// Whether a listen address (host:port, [v6]:port, unix:path) is reachable
// from this machine only: 127.0.0.0/8, ::1, localhost, or a unix socket.
bool IsLoopbackAddress(absl::string_view address);

// Reads a whole file that may hold secrets (keys, tokens). The error names
// `flag` and `path` and the OS reason, never any content.
absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path);

}  // namespace cohort
