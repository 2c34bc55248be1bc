#include "common/metrics_server.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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
