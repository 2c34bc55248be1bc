#include "common/tls_credentials.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "openssl/bio.h"
#include "openssl/err.h"
#include "openssl/pem.h"
#include "openssl/x509.h"

namespace cohort {
namespace {

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::string Subject(X509* cert) {
  char buffer[256];
  X509_NAME_oneline(X509_get_subject_name(cert), buffer, sizeof(buffer));
  return buffer;
}

std::string TimeText(const ASN1_TIME* time) {
  std::unique_ptr<BIO, BioDeleter> out(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(out.get(), time);
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

// Every certificate in `pem` (at least one), each within its validity period.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& flag,
                                                       const std::string& path,
                                                       const std::string& pem) {
  std::unique_ptr<BIO, BioDeleter> bio = MemoryBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();  // the loop ends on a "no start line" error
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": holds no PEM certificate"));
  }
  for (const X509Ptr& cert : certs) {
    if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", path, ": certificate ", Subject(cert.get()), " expired on ",
          TimeText(X509_get0_notAfter(cert.get()))));
    }
    if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", path, ": certificate ", Subject(cert.get()), " is not valid before ",
          TimeText(X509_get0_notBefore(cert.get()))));
    }
  }
  return certs;
}

// The PEM contents of a certificate chain and its key, checked to match.
struct KeyPair {
  std::string cert;
  std::string key;
};

absl::StatusOr<KeyPair> ReadKeyPair(const std::string& cert_flag, const std::string& cert_path,
                                    const std::string& key_flag, const std::string& key_path) {
  if (cert_path.empty() != key_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        cert_flag, " and ", key_flag, ": give both or neither (", cert_path.empty() ? key_flag
                                                                                   : cert_flag,
        " is set alone)"));
  }
  KeyPair pair;
  ASSIGN_OR_RETURN(pair.cert, ReadSecretFile(cert_flag, cert_path));
  ASSIGN_OR_RETURN(pair.key, ReadSecretFile(key_flag, key_path));
  ASSIGN_OR_RETURN(std::vector<X509Ptr> certs, ParseCertificates(cert_flag, cert_path, pair.cert));
  std::unique_ptr<BIO, BioDeleter> bio = MemoryBio(pair.key);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, " ", key_path, ": holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(certs.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, " ", key_path, ": is not the private key of ", cert_flag, " ", cert_path, " (",
        Subject(certs.front().get()), ")"));
  }
  return pair;
}

absl::StatusOr<std::string> ReadCaBundle(const std::string& flag, const std::string& path) {
  ASSIGN_OR_RETURN(std::string pem, ReadSecretFile(flag, path));
  RETURN_IF_ERROR(ParseCertificates(flag, path, pem).status());
  return pem;
}

}  // namespace

bool IsLoopbackAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  absl::string_view host = address;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == absl::string_view::npos ? absl::string_view::npos
                                                                     : host.find(']') - 1);
  } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    const std::string reason = absl::StrCat(flag, " ", path, ": cannot read (", std::strerror(error), ")");
    return error == ENOENT ? absl::NotFoundError(reason) : absl::PermissionDeniedError(reason);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(flag, " ", path, ": read failed"));
  return contents.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files) {
  if (files.cert.empty() && files.key.empty()) {
    if (!files.client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca: needs --tls_cert and --tls_key (client certificates are checked in "
          "the TLS handshake)");
    }
    return grpc::InsecureServerCredentials();
  }
  ASSIGN_OR_RETURN(KeyPair pair, ReadKeyPair("--tls_cert", files.cert, "--tls_key", files.key));
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({pair.key, pair.cert});
  if (!files.client_ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadCaBundle("--tls_client_ca", files.client_ca));
    // Users (cohortctl with a bearer token) connect without a certificate;
    // one that is presented must verify, or the handshake fails.
    options.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

CoordinatorTarget CoordinatorTarget::Insecure(std::string address) {
  CoordinatorTarget target;
  target.address = std::move(address);
  target.credentials = grpc::InsecureChannelCredentials();
  return target;
}

std::shared_ptr<grpc::Channel> CoordinatorTarget::NewChannel(grpc::ChannelArguments args) const {
  if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
  return grpc::CreateCustomChannel(address, credentials, args);
}

absl::StatusOr<CoordinatorTarget> MakeCoordinatorTarget(std::string address,
                                                        const ClientTlsFiles& files) {
  if (files.ca.empty()) {
    if (!files.cert.empty() || !files.key.empty() || !files.server_name.empty()) {
      return absl::InvalidArgumentError(
          "--tls_cert, --tls_key and --tls_server_name: need --tls_ca (the CA that signed the "
          "coordinator's certificate)");
    }
    return CoordinatorTarget::Insecure(std::move(address));
  }
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadCaBundle("--tls_ca", files.ca));
  if (!files.cert.empty() || !files.key.empty()) {
    ASSIGN_OR_RETURN(KeyPair pair, ReadKeyPair("--tls_cert", files.cert, "--tls_key", files.key));
    options.pem_cert_chain = std::move(pair.cert);
    options.pem_private_key = std::move(pair.key);
  }
  CoordinatorTarget target;
  target.address = std::move(address);
  target.credentials = grpc::SslCredentials(options);
  target.server_name = files.server_name;
  target.secure = true;
  return target;
}

}  // namespace cohort
