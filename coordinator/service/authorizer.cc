#include "coordinator/service/authorizer.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/tls_credentials.h"
#include "grpcpp/security/auth_context.h"
#include "openssl/pem.h"
#include "openssl/x509v3.h"
#include "openssl/evp.h"

namespace cohort::coordinator {
namespace {

constexpr size_t kMinTokenLength = 16;

std::string Sha256(absl::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(text.data(), text.size(), digest, &length, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), length);
}

const char* RoleName(Role role) { return role == Role::kAdmin ? "admin" : "read"; }

}  // namespace

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const Options& options) {
  if (options.tokens_file.empty()) {
    return FromTokens(options.require_worker_certificate, "", "");
  }
  ASSIGN_OR_RETURN(std::string contents,
                   ReadSecretFile("--auth_tokens_file", options.tokens_file));
  return FromTokens(options.require_worker_certificate, contents,
                    "--auth_tokens_file " + options.tokens_file);
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::FromTokens(
    bool require_worker_certificate, absl::string_view contents, const std::string& source) {
  std::unique_ptr<Authorizer> authorizer(new Authorizer());
  authorizer->require_worker_certificate_ = require_worker_certificate;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    // Errors name the line, never the token.
    const std::string where = absl::StrCat(source, " line ", line_number, ": ");
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected `ROLE NAME TOKEN`, found ", fields.size(), " fields"));
    }
    TokenInfo info;
    if (fields[0] == "admin") {
      info.role = Role::kAdmin;
    } else if (fields[0] == "read") {
      info.role = Role::kRead;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "role must be `read` or `admin`, not `", fields[0], "`"));
    }
    info.name = std::string(fields[1]);
    if (fields[2].size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the token of ", info.name, " has ",
                                                     fields[2].size(), " characters; at least ",
                                                     kMinTokenLength, " are required"));
    }
    if (!authorizer->tokens_.emplace(Sha256(fields[2]), info).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "the token of ", info.name, " is also listed on an earlier line"));
    }
  }
  return authorizer;
}

absl::Status Authorizer::Check(absl::string_view method, Access access,
                               absl::string_view authorization, bool peer_has_certificate) const {
  switch (access) {
    case Access::kWorker:
      if (!require_worker_certificate_ || peer_has_certificate) return absl::OkStatus();
      return absl::UnauthenticatedError(absl::StrCat(
          method, " is for workers: it needs a TLS client certificate signed by the cluster CA "
                  "(the worker's --tls_cert and --tls_key)"));
    case Access::kWorkerOrRead:
      if (require_worker_certificate_ && peer_has_certificate) return absl::OkStatus();
      return CheckUser(method, Access::kRead, authorization);
    case Access::kRead:
    case Access::kAdmin:
      return CheckUser(method, access, authorization);
  }
  return absl::InternalError("unknown access kind");
}

absl::Status Authorizer::CheckUser(absl::string_view method, Access access,
                                   absl::string_view authorization) const {
  if (tokens_.empty()) return absl::OkStatus();
  const absl::string_view needed = access == Access::kAdmin ? "an admin" : "a read or admin";
  if (authorization.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, " needs ", needed,
        " bearer token (authorization metadata; cohortctl: COHORT_TOKEN or --token_file)"));
  }
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(authorization, kScheme)) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": the authorization metadata is not `Bearer <token>`"));
  }
  auto found = tokens_.find(Sha256(absl::StripAsciiWhitespace(authorization.substr(kScheme.size()))));
  if (found == tokens_.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": the bearer token is not one of this coordinator's tokens"));
  }
  if (access == Access::kAdmin && found->second.role != Role::kAdmin) {
    return absl::PermissionDeniedError(absl::StrCat(method, " needs an admin token; the token of ",
                                                    found->second.name, " has role ",
                                                    RoleName(found->second.role)));
  }
  return absl::OkStatus();
}

absl::Status Authorizer::Check(const grpc::ServerContextBase& context, absl::string_view method,
                               Access access) const {
  absl::string_view authorization;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  // With GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY a presented
  // certificate has been verified by the handshake; the peer counts as
  // authenticated only then.
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  const bool certificate = auth != nullptr && auth->IsPeerAuthenticated() &&
                           !auth->FindPropertyValues("x509_pem_cert").empty();
  return Check(method, access, authorization, certificate);
}

namespace {

// The URI subject alternative names of a PEM certificate.
std::vector<std::string> UriNames(absl::string_view pem) {
  std::vector<std::string> uris;
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  if (bio == nullptr) return uris;
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (cert == nullptr) return uris;
  std::unique_ptr<GENERAL_NAMES, decltype(&GENERAL_NAMES_free)> names(
      static_cast<GENERAL_NAMES*>(
          X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)),
      &GENERAL_NAMES_free);
  if (names == nullptr) return uris;
  for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                      static_cast<size_t>(ASN1_STRING_length(uri)));
  }
  return uris;
}

}  // namespace

WorkerIdentity Authorizer::IdentityOf(const grpc::ServerContextBase& context) const {
  if (!require_worker_certificate_) return WorkerIdentity::Any();
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return WorkerIdentity();
  const std::vector<grpc::string_ref> pem = auth->FindPropertyValues("x509_pem_cert");
  if (pem.empty()) return WorkerIdentity();
  return WorkerIdentity::FromUris(UriNames(absl::string_view(pem[0].data(), pem[0].size())));
}

}  // namespace cohort::coordinator
