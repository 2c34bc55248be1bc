// Tests for FakeKvServer through a raw cohort.v1.KeyValue stub.
#include "tests/testing/fake_kv_server.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "cohort/v1/kv.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/testing/net.h"
#include "tests/testing/wait.h"

namespace cohort::testing {
namespace {

class FakeKvServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(FakeKvServer::Options()); }

  void StartServer(FakeKvServer::Options options) {
    auto server = FakeKvServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::KeyValue::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  static v1::KvScope Scope(const std::string& job, uint64_t generation) {
    v1::KvScope scope;
    scope.set_job_id(job);
    scope.set_generation(generation);
    return scope;
  }

  grpc::Status Set(const v1::KvScope& scope, const std::string& key, const std::string& value) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SetRequest request;
    *request.mutable_scope() = scope;
    request.set_key(key);
    request.set_value(value);
    v1::SetResponse response;
    return stub_->Set(&context, request, &response);
  }

  grpc::Status WaitFor(const v1::KvScope& scope, const std::string& key, uint32_t timeout_ms,
                       std::string* value) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::WaitForRequest request;
    *request.mutable_scope() = scope;
    request.set_key(key);
    request.set_timeout_ms(timeout_ms);
    v1::GetResponse response;
    grpc::Status status = stub_->WaitFor(&context, request, &response);
    *value = response.value();
    return status;
  }

  std::unique_ptr<FakeKvServer> server_;
  std::unique_ptr<v1::KeyValue::Stub> stub_;
};

TEST_F(FakeKvServerTest, SetThenWaitForReturnsValue) {
  ASSERT_TRUE(Set(Scope("job", 1), "k", std::string("v\0w", 3)).ok());
  std::string value;
  grpc::Status status = WaitFor(Scope("job", 1), "k", 1000, &value);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, std::string("v\0w", 3));
  EXPECT_EQ(server_->set_requests(), 1);
  EXPECT_EQ(server_->wait_requests(), 1);
}

TEST_F(FakeKvServerTest, SetOverwrites) {
  ASSERT_TRUE(Set(Scope("job", 1), "k", "a").ok());
  ASSERT_TRUE(Set(Scope("job", 1), "k", "b").ok());
  std::string value;
  ASSERT_TRUE(WaitFor(Scope("job", 1), "k", 1000, &value).ok());
  EXPECT_EQ(value, "b");
}

TEST_F(FakeKvServerTest, WaitForTimesOut) {
  std::string value;
  const absl::Time start = absl::Now();
  grpc::Status status = WaitFor(Scope("job", 1), "missing", 50, &value);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(server_->waiting(), 0);
}

TEST_F(FakeKvServerTest, ScopesAreIsolated) {
  ASSERT_TRUE(Set(Scope("job", 1), "k", "gen1").ok());
  ASSERT_TRUE(Set(Scope("job", 2), "k", "gen2").ok());
  ASSERT_TRUE(Set(Scope("other", 1), "k", "other").ok());
  std::string value;
  ASSERT_TRUE(WaitFor(Scope("job", 1), "k", 1000, &value).ok());
  EXPECT_EQ(value, "gen1");
  ASSERT_TRUE(WaitFor(Scope("job", 2), "k", 1000, &value).ok());
  EXPECT_EQ(value, "gen2");
  ASSERT_TRUE(WaitFor(Scope("other", 1), "k", 1000, &value).ok());
  EXPECT_EQ(value, "other");
  EXPECT_EQ(WaitFor(Scope("job", 3), "k", 20, &value).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_F(FakeKvServerTest, WaiterReleasedByLaterSet) {
  std::string value;
  grpc::Status status;
  std::jthread waiter([&] { status = WaitFor(Scope("job", 4), "addr", 20000, &value); });
  ASSERT_TRUE(WaitUntil([&] { return server_->waiting() == 1; }, absl::Seconds(10)));
  ASSERT_TRUE(Set(Scope("job", 4), "addr", "hello").ok());
  waiter.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, "hello");
}

TEST_F(FakeKvServerTest, DropGenerationAbortsWaitersAndLaterCalls) {
  ASSERT_TRUE(Set(Scope("job", 5), "old", "x").ok());
  ASSERT_TRUE(Set(Scope("job", 6), "k", "next").ok());
  std::string value;
  grpc::Status status;
  std::jthread waiter([&] { status = WaitFor(Scope("job", 5), "never", 20000, &value); });
  ASSERT_TRUE(WaitUntil([&] { return server_->waiting() == 1; }, absl::Seconds(10)));
  server_->DropGeneration("job", 5);
  waiter.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED) << status.error_message();
  EXPECT_EQ(WaitFor(Scope("job", 5), "old", 1000, &value).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(Set(Scope("job", 5), "old", "y").error_code(), grpc::StatusCode::ABORTED);
  // Other generations are untouched.
  ASSERT_TRUE(WaitFor(Scope("job", 6), "k", 1000, &value).ok());
  EXPECT_EQ(value, "next");
}

TEST_F(FakeKvServerTest, RejectsBadRequests) {
  std::string value;
  EXPECT_EQ(Set(Scope("", 1), "k", "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Set(Scope("job", 0), "k", "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Set(Scope("job", 1), "", "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(WaitFor(Scope("job", 0), "k", 10, &value).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(FakeKvServerTest, MaxWaitCapsOneRequest) {
  FakeKvServer::Options options;
  options.max_wait = absl::Milliseconds(30);
  StartServer(options);
  std::string value;
  const absl::Time start = absl::Now();
  // timeout_ms 0 means the server's maximum; 10 s is capped the same way.
  EXPECT_EQ(WaitFor(Scope("job", 1), "k", 0, &value).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(WaitFor(Scope("job", 1), "k", 10000, &value).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(FakeKvServerTest, ListensOnRequestedPort) {
  const int port = PickFreePort();
  FakeKvServer::Options options;
  options.port = port;
  StartServer(options);
  EXPECT_EQ(server_->port(), port);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(Set(Scope("job", 1), "k", "v").ok());
}

TEST_F(FakeKvServerTest, ShutdownReleasesWaiters) {
  std::string value;
  grpc::Status status;
  std::jthread waiter([&] { status = WaitFor(Scope("job", 1), "never", 20000, &value); });
  ASSERT_TRUE(WaitUntil([&] { return server_->waiting() == 1; }, absl::Seconds(10)));
  const absl::Time start = absl::Now();
  server_.reset();
  waiter.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace cohort::testing
