#pragma once
// absl::Status <-> grpc::Status, converted once at each gRPC edge. Both use
// the canonical code numbering, so codes carry over unchanged.

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace cohort {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// `context`, when given, prefixes the message ("<context>: <message>").
inline absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& context = "") {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      context.empty() ? status.error_message()
                                      : context + ": " + status.error_message());
}

// "OK", "NOT_FOUND", ... (used as a metrics label).
inline std::string StatusCodeLabel(const absl::Status& status) {
  return absl::StatusCodeToString(status.code());
}

}  // namespace cohort
