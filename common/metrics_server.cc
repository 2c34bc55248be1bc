#include "common/metrics_server.h"

#include <dlfcn.h>
#include <pthread.h>

#include <cerrno>
#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

// civetweb (under prometheus-cpp's Exposer) starts its threads with a small
// explicit stack (a few times sizeof(mg_connection)), and glibc carves every
// loaded library's static TLS out of that stack. A worker also loads
// OpenBLAS, whose TLS is 60 KiB per thread, and the first /metrics request
// then overflowed the remaining stack (SIGSEGV in vsnprintf). This
// definition, in the object that every metrics-serving binary links,
// interposes on the libc function for the whole process and raises explicit
// stack sizes to at least kMinThreadStack; larger requests pass unchanged.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Real = int (*)(pthread_attr_t*, size_t);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinThreadStack = size_t{1} << 20;
  if (real == nullptr) return ENOSYS;
  return real(attr, size < kMinThreadStack ? kMinThreadStack : size);
}

namespace cohort {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Create(
    const std::string& bind_address, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports bind failures by throwing; convert once, here.
  try {
    exposer = std::make_unique<prometheus::Exposer>(bind_address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", bind_address, ": ", e.what()));
  }
  exposer->RegisterCollectable(registry);
  std::string host = bind_address.substr(0, bind_address.rfind(':'));
  auto ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics server on ", bind_address, " bound no port"));
  }
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), absl::StrCat(host, ":", ports.front())));
}

}  // namespace cohort
