#pragma once
// gRPC answers a unary or server-streaming request whose bytes do not parse
// with an empty UNIMPLEMENTED (its callback handlers cannot tell a bad
// message from a missing method). This interceptor turns that answer into
// INVALID_ARGUMENT naming the method and the message type it expected, so a
// client with a mismatched proto learns what is wrong. Streaming requests
// are parsed by Cohort's own reactors, which answer INVALID_ARGUMENT
// themselves.

#include <memory>
#include <vector>

#include "grpcpp/support/server_interceptor.h"

namespace cohort::coordinator {

class ParseErrorInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // nullptr (no interceptor, no cost) for client- and bidi-streaming calls.
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

// The interceptor factories the coordinator's server installs.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
CoordinatorInterceptors();

}  // namespace cohort::coordinator
