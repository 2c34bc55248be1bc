#include "coordinator/service/parse_error_interceptor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/status.h"

namespace cohort::coordinator {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/cohort.v1.Jobs/Submit" -> "cohort.v1.SubmitJobRequest", or "" when the
// method is not in the generated descriptor pool.
std::string RequestTypeOf(const char* method) {
  std::string name = method == nullptr ? "" : method;
  if (!name.empty() && name[0] == '/') name.erase(0, 1);
  const google::protobuf::MethodDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
          absl::StrReplaceAll(name, {{"/", "."}}));
  return descriptor == nullptr ? "" : descriptor->input_type()->full_name();
}

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(const char* method) : method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // The handler hands interceptors a null message exactly when it failed
    // to deserialize the request.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      const std::string type = RequestTypeOf(method_);
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("the request to ", method_ == nullptr ? "this method" : method_,
                       " does not parse as a ", type.empty() ? "protobuf message" : type,
                       " (is the client built from another version of cohort's protos?)")));
    }
    methods->Proceed();
  }

 private:
  const char* method_;  // gRPC's, alive as long as the server
  bool unparsed_ = false;
};

}  // namespace

grpc::experimental::Interceptor* ParseErrorInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  using Type = grpc::experimental::ServerRpcInfo::Type;
  if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) return nullptr;
  return new ParseErrorInterceptor(info->method());
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
CoordinatorInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<ParseErrorInterceptorFactory>());
  return factories;
}

}  // namespace cohort::coordinator
