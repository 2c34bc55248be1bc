#pragma once
// absl::Status <-> grpc::Status, converted once at the edge.

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace cohort::coordinator {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// "OK", "NOT_FOUND", ... (used as a metrics label).
inline std::string StatusCodeLabel(const absl::Status& status) {
  return absl::StatusCodeToString(status.code());
}

}  // namespace cohort::coordinator
