#pragma once
// Serves a prometheus-cpp Registry at http://<address>/metrics.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace cohort {

// Thread-safe after Create. Stops serving when destroyed.
class MetricsServer {
 public:
  // `bind_address` is host:port; port 0 picks a free port (see address()).
  // Returns Unavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Create(
      const std::string& bind_address, std::shared_ptr<prometheus::Registry> registry);

  // host:port actually bound.
  const std::string& address() const { return address_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string address)
      : exposer_(std::move(exposer)), address_(std::move(address)) {}
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

}  // namespace cohort
