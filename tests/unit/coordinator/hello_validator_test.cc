#include "coordinator/membership/hello_validator.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::Hello Good() {
  v1::Hello hello;
  hello.set_worker_id("node-7-gpu-3");
  hello.set_host("node-7.cluster.local");
  hello.set_device_kind(v1::DEVICE_KIND_GPU);
  hello.set_device_index(3);
  hello.set_incarnation(42);
  hello.set_metrics_address("[::1]:9464");
  hello.mutable_capabilities()->set_device_name("NVIDIA H200");
  hello.mutable_capabilities()->add_transports("nccl");
  hello.mutable_held()->set_job_id("gpt-12");
  return hello;
}

TEST(HelloValidatorTest, AnOrdinaryHelloPasses) { EXPECT_TRUE(ValidateHello(Good()).ok()); }

// Issue 21: a worker id with a newline forged coordinator log lines; 4 MiB
// ids grew memory, the log and Workers.List.
TEST(HelloValidatorTest, EveryStoredStringIsBoundedAndNeverEchoedWhenHostile) {
  struct Case {
    const char* field;
    void (*set)(v1::Hello&);
  };
  const Case cases[] = {
      {"hello.worker_id", [](v1::Hello& h) { h.set_worker_id("w0\nI 2026-12-05 forged"); }},
      {"hello.worker_id", [](v1::Hello& h) { h.set_worker_id(std::string(4 << 20, 'w')); }},
      {"hello.worker_id", [](v1::Hello& h) { h.set_worker_id(""); }},
      {"hello.host", [](v1::Hello& h) { h.set_host("h\r\nforged"); }},
      {"hello.host", [](v1::Hello& h) { h.set_host(std::string(300, 'h')); }},
      {"hello.device_index", [](v1::Hello& h) { h.set_device_index(-1); }},
      {"hello.metrics_address", [](v1::Hello& h) { h.set_metrics_address("a b"); }},
      {"hello.capabilities.device_name",
       [](v1::Hello& h) { h.mutable_capabilities()->set_device_name("gpu\nforged"); }},
      {"hello.capabilities.transports",
       [](v1::Hello& h) { for (int i = 0; i < 17; ++i) h.mutable_capabilities()->add_transports("ucx"); }},
      {"hello.capabilities", [](v1::Hello& h) { h.mutable_capabilities()->set_memory_bytes(-1); }},
      {"hello.held.job_id", [](v1::Hello& h) { h.mutable_held()->set_job_id(std::string(1 << 20, 'j')); }},
  };
  for (const Case& c : cases) {
    v1::Hello hello = Good();
    c.set(hello);
    const absl::Status status = ValidateHello(hello);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(std::string(c.field) + ":")) << status;
    EXPECT_THAT(status.message(), Not(HasSubstr("forged"))) << status;
    EXPECT_LT(status.message().size(), 200u) << c.field;
  }
}

TEST(HelloValidatorTest, DeviceNamesMayBeUtf8) {
  v1::Hello hello = Good();
  hello.mutable_capabilities()->set_device_name("Intel\xc2\xae Xeon\xc2\xae");
  EXPECT_TRUE(ValidateHello(hello).ok());
}

}  // namespace
}  // namespace cohort::coordinator
