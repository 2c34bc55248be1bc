#include <string>

#include "common/job_spec/io.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tools/cohortctl/spec_builder.h"

namespace cohort::cohortctl {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kDemoYaml = std::string(COHORT_SOURCE_DIR) + "/deploy/local/jobs/demo.yaml";

TEST(SpecBuilderTest, DemoJobSpecMatchesTheShippedDemoFile) {
  absl::StatusOr<v1::JobSpec> file = ReadJobSpecFile(kDemoYaml);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(MessageDifferencer::Equals(DemoJobSpec(), *file))
      << DemoJobSpec().DebugString() << "\nvs\n"
      << file->DebugString();
}

TEST(SpecBuilderTest, NoFileAndNoFlagsGivesTheDemo) {
  absl::StatusOr<v1::JobSpec> spec = BuildSubmitSpec("", SpecFlags{});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*spec, DemoJobSpec()));
}

TEST(SpecBuilderTest, FlagsOverrideOnlyWhatTheyName) {
  const SpecFlags flags = {{"name", "big"},      {"device", "gpu"},      {"layers", "12"},
                           {"tensor", "4"},       {"pipeline", "2"},      {"zero1", "true"},
                           {"min_workers", "8"},  {"max_workers", "16"},  {"steps", "5000"},
                           {"lr", "6e-4"},        {"seed", "7"},          {"steps", "5000"}};
  absl::StatusOr<v1::JobSpec> spec = BuildSubmitSpec(kDemoYaml, flags);
  ASSERT_TRUE(spec.ok()) << spec.status();

  v1::JobSpec expected = DemoJobSpec();
  expected.set_name("big");
  expected.set_device_kind(v1::DEVICE_KIND_GPU);
  expected.mutable_model()->set_layers(12);
  expected.mutable_parallelism()->set_tensor(4);
  expected.mutable_parallelism()->set_pipeline(2);
  expected.mutable_parallelism()->set_zero1(true);
  expected.mutable_elastic()->set_min_workers(8);
  expected.mutable_elastic()->set_max_workers(16);
  expected.set_steps(5000);
  expected.mutable_optimizer()->set_learning_rate(6e-4);
  expected.mutable_data()->set_seed(7);
  expected.mutable_data()->mutable_synthetic()->set_seed(7);
  EXPECT_TRUE(MessageDifferencer::Equals(*spec, expected)) << spec->DebugString();
}

TEST(SpecBuilderTest, DataShardsReplaceTheSyntheticSource) {
  const SpecFlags flags = {{"data_shards", "/data/*.bin"}};
  absl::StatusOr<v1::JobSpec> spec = BuildSubmitSpec("", flags);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->data().has_synthetic());
  EXPECT_EQ(spec->data().shards().pattern(), "/data/*.bin");
  EXPECT_EQ(spec->data().seed(), 1u);
}

TEST(SpecBuilderTest, BadDeviceIsInvalidArgument) {
  const SpecFlags flags = {{"device", "abacus"}};
  v1::JobSpec spec;
  const absl::Status status = ApplySpecFlags(flags, &spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("abacus"));
}

TEST(SpecBuilderTest, FileErrorsKeepThePath) {
  const std::string missing = ::testing::TempDir() + "/missing.yaml";
  absl::StatusOr<v1::JobSpec> spec = BuildSubmitSpec(missing, SpecFlags{});
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), StartsWith(missing + ": "));
}

}  // namespace
}  // namespace cohort::cohortctl
