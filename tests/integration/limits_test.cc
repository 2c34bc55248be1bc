// Over-limit requests to a real coordinator get ResourceExhausted with a
// message naming the limit: streams per client, request message size and
// KeyValue value size.

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "cohort/v1/jobs.grpc.pb.h"
#include "cohort/v1/kv.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "tests/testing/testing.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;

class LimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_.StartCoordinator("10s", {"--max_streams_per_client=3", "--max_message_bytes=1048576",
                                      "--max_kv_value_bytes=1000"});
    auto job = cluster_.Submit(SmallJobSpec("limits", 1, 1, 1));
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->job_id();
  }

  LocalCluster cluster_{"limits"};
  std::string job_id_;
};

TEST_F(LimitsTest, StreamsPerClientAreCappedAndFreedWhenAStreamEnds) {
  auto stub = v1::Jobs::NewStub(cluster_.channel());
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  v1::WatchJobRequest request;
  request.set_job_id(job_id_);
  for (int i = 0; i < 3; ++i) {
    auto watch = std::make_unique<Watch>();
    watch->reader = stub->Watch(&watch->context, request);
    v1::JobEvent first;
    ASSERT_TRUE(watch->reader->Read(&first)) << "watch " << i << " got no snapshot";
    watches.push_back(std::move(watch));
  }
  Watch refused;
  refused.context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  refused.reader = stub->Watch(&refused.context, request);
  v1::JobEvent event;
  EXPECT_FALSE(refused.reader->Read(&event));
  grpc::Status status = refused.reader->Finish();
  std::printf("  4th Watch: %d %s\n", status.error_code(), status.error_message().c_str());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("already holds 3 open streams"));
  EXPECT_THAT(status.error_message(), HasSubstr("--max_streams_per_client"));

  // Ending one frees its slot (bounded poll: the server sees the cancel
  // asynchronously).
  watches.back()->context.TryCancel();
  watches.back()->reader->Finish();
  watches.pop_back();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  for (;;) {
    Watch again;
    again.reader = stub->Watch(&again.context, request);
    if (again.reader->Read(&event)) {
      again.context.TryCancel();
      again.reader->Finish();
      break;
    }
    ASSERT_EQ(again.reader->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    ASSERT_LT(absl::Now(), give_up) << "the cancelled watch's slot was never freed";
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (auto& watch : watches) {
    watch->context.TryCancel();
    watch->reader->Finish();
  }
}

TEST_F(LimitsTest, LargeMessagesAndValuesAreRefusedNamingTheLimit) {
  auto kv = v1::KeyValue::NewStub(cluster_.channel());
  auto set = [&](size_t bytes) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SetRequest request;
    request.mutable_scope()->set_job_id(job_id_);
    request.mutable_scope()->set_generation(1);
    request.set_key("big");
    request.set_value(std::string(bytes, 'x'));
    v1::SetResponse response;
    return kv->Set(&context, request, &response);
  };
  grpc::Status message = set(2 << 20);
  std::printf("  2 MiB request: %d %s\n", message.error_code(), message.error_message().c_str());
  EXPECT_EQ(message.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(message.error_message(), HasSubstr("1048576"));

  grpc::Status value = set(1001);
  std::printf("  1001-byte value: %d %s\n", value.error_code(), value.error_message().c_str());
  EXPECT_EQ(value.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(value.error_message(), HasSubstr("limit of 1000 bytes (--max_kv_value_bytes)"));
  // Within the limit the job's scope is not active yet (no mesh): the
  // request got past the limits to the KeyValue logic.
  EXPECT_NE(set(1000).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

}  // namespace
}  // namespace cohort::testing
