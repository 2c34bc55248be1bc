#include "common/job_spec/io.h"

#include <fstream>
#include <string>

#include "cohort/v1/jobs.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace cohort {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string DemoPath(const std::string& name) {
  return std::string(COHORT_SOURCE_DIR) + "/deploy/local/jobs/" + name;
}

std::string WriteTempFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

void ExpectDemoSpec(const v1::JobSpec& spec) {
  EXPECT_EQ(spec.name(), "demo");
  EXPECT_EQ(spec.device_kind(), v1::DEVICE_KIND_CPU);
  EXPECT_EQ(spec.model().layers(), 2);
  EXPECT_EQ(spec.model().heads(), 4);
  EXPECT_EQ(spec.model().width(), 64);
  EXPECT_EQ(spec.model().vocab_size(), 256);
  EXPECT_EQ(spec.model().context_length(), 64);
  EXPECT_EQ(spec.model().init_seed(), 42u);
  ASSERT_TRUE(spec.data().has_synthetic());
  EXPECT_EQ(spec.data().synthetic().seed(), 1u);
  EXPECT_EQ(spec.data().synthetic().alphabet_size(), 16);
  EXPECT_EQ(spec.data().synthetic().branching(), 4);
  EXPECT_EQ(spec.data().synthetic().order(), 1);
  EXPECT_EQ(spec.data().synthetic().tokens(), 1000000);
  EXPECT_EQ(spec.data().seed(), 1u);
  EXPECT_DOUBLE_EQ(spec.optimizer().learning_rate(), 3e-3);
  EXPECT_DOUBLE_EQ(spec.optimizer().min_learning_rate(), 3e-4);
  EXPECT_EQ(spec.optimizer().warmup_steps(), 20);
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(spec.optimizer().grad_clip(), 1.0);
  EXPECT_EQ(spec.batch().global_batch_size(), 16);
  EXPECT_EQ(spec.batch().micro_batch_size(), 4);
  EXPECT_EQ(spec.parallelism().tensor(), 1);
  EXPECT_EQ(spec.parallelism().pipeline(), 1);
  EXPECT_TRUE(spec.parallelism().zero1());
  EXPECT_EQ(spec.elastic().min_workers(), 2);
  EXPECT_EQ(spec.elastic().max_workers(), 4);
  EXPECT_EQ(spec.steps(), 500);
  EXPECT_EQ(spec.checkpoint().interval_steps(), 0);
}

TEST(JobSpecIoTest, DemoYamlAndJsonDescribeTheSameJob) {
  absl::StatusOr<v1::JobSpec> yaml = ReadJobSpecFile(DemoPath("demo.yaml"));
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  absl::StatusOr<v1::JobSpec> json = ReadJobSpecFile(DemoPath("demo.json"));
  ASSERT_TRUE(json.ok()) << json.status();
  ExpectDemoSpec(*yaml);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*yaml, *json))
      << yaml->DebugString() << "\nvs\n"
      << json->DebugString();
}

TEST(JobSpecIoTest, DetectsFormatByExtensionThenContent) {
  EXPECT_EQ(DetectJobSpecFormat("a.json", "name: x"), JobSpecFormat::kJson);
  EXPECT_EQ(DetectJobSpecFormat("a.YAML", "{}"), JobSpecFormat::kYaml);
  EXPECT_EQ(DetectJobSpecFormat("a.yml", "{}"), JobSpecFormat::kYaml);
  EXPECT_EQ(DetectJobSpecFormat("spec", "\n  {\"name\": \"x\"}"), JobSpecFormat::kJson);
  EXPECT_EQ(DetectJobSpecFormat("spec", "name: x"), JobSpecFormat::kYaml);
}

TEST(JobSpecIoTest, SniffedFileWithoutExtensionParses) {
  const std::string path = WriteTempFile("sniffed_spec", "{\"name\": \"x\", \"steps\": 5}");
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "x");
  EXPECT_EQ(spec->steps(), 5);
}

// Issue 21: `cohortctl submit /dev/zero` read until std::bad_alloc.
TEST(JobSpecIoTest, AFileThatNeverEndsOrIsTooLargeIsRefused) {
  absl::StatusOr<v1::JobSpec> zero = ReadJobSpecFile("/dev/zero");
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("/dev/zero: larger than 1048576 bytes"));
  // Appended, not concatenated: g++ 12 at -O3 warns falsely (array-bounds)
  // about operator+ on a string this long.
  std::string large = "{\"name\": \"";
  large.append(kMaxJobSpecFileBytes, 'x');
  large += "\"}";
  const std::string path = WriteTempFile("large_spec", large);
  EXPECT_EQ(ReadJobSpecFile(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobSpecIoTest, JsonAcceptsSnakeCaseAndCamelCase) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec(R"({"model": {"vocab_size": 100, "contextLength": 32}})", JobSpecFormat::kJson);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().vocab_size(), 100);
  EXPECT_EQ(spec->model().context_length(), 32);
}

TEST(JobSpecIoTest, YamlAcceptsCamelCaseToo) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("model:\n  vocabSize: 100\n", JobSpecFormat::kYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().vocab_size(), 100);
}

TEST(JobSpecIoTest, YamlUnknownFieldNamesLineAndField) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("name: demo\nmodel:\n  layers: 2\n  layer: 3\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(StartsWith("line 4, column 3: "), HasSubstr("unknown field \"layer\" in model"),
                    HasSubstr("cohort.v1.ModelConfig"), HasSubstr("known fields: layers, heads")));
}

TEST(JobSpecIoTest, YamlSyntaxErrorHasLineAndColumn) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("name: demo\nmodel: [1, 2\nsteps: 3\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(HasSubstr("YAML syntax error"), HasSubstr("line ")));
}

TEST(JobSpecIoTest, YamlWrongScalarTypeNamesFieldAndLine) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec("model:\n  layers: two\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "line 2, column 11: model.layers: expected a 32-bit integer, got "
            "\"two\"");
}

TEST(JobSpecIoTest, YamlOutOfRangeIntegerIsRefused) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("model:\n  layers: 3000000000\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("expected a 32-bit integer"));
}

TEST(JobSpecIoTest, YamlMapWhereScalarBelongsIsRefused) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec("steps:\n  count: 3\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(StartsWith("line 2, column 3: "),
                    HasSubstr("steps: expected a single int64 value, got a map")));
}

TEST(JobSpecIoTest, YamlScalarWhereMessageBelongsIsRefused) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec("model: big\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("model: expected a map of cohort.v1.ModelConfig fields, "
                        "got a scalar"));
}

TEST(JobSpecIoTest, YamlTopLevelMustBeAMap) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec("- a\n- b\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("the document: expected a map of cohort.v1.JobSpec"));
}

TEST(JobSpecIoTest, YamlStringFieldKeepsNumericLookingText) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("name: 2024\nsteps: \"300\"\n", JobSpecFormat::kYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "2024");
  EXPECT_EQ(spec->steps(), 300);  // a quoted number still fills an int field
}

TEST(JobSpecIoTest, YamlBoolsEnumsAndLargeUnsigned) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(
      "device_kind: DEVICE_KIND_GPU\nparallelism:\n  zero1: True\n"
      "data:\n  seed: 18446744073709551615\n",
      JobSpecFormat::kYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->device_kind(), v1::DEVICE_KIND_GPU);
  EXPECT_TRUE(spec->parallelism().zero1());
  EXPECT_EQ(spec->data().seed(), 18446744073709551615ull);
}

TEST(JobSpecIoTest, YamlUnknownEnumListsTheValues) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec("device_kind: TPU\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(HasSubstr("device_kind: expected one of"), HasSubstr("DEVICE_KIND_CPU"),
                    HasSubstr("\"TPU\"")));
}

TEST(JobSpecIoTest, YamlEmptySectionLeavesMessageUnset) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec("name: x\noptimizer:\n", JobSpecFormat::kYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_optimizer());
}

TEST(JobSpecIoTest, YamlOneofConflictIsRefused) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("data:\n  synthetic: {seed: 1}\n  shards: {pattern: x}\n", JobSpecFormat::kYaml);
  EXPECT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobSpecIoTest, JsonUnknownFieldIsInvalidArgument) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec(R"({"name": "x", "stepz": 3})", JobSpecFormat::kJson);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("stepz"));
}

TEST(JobSpecIoTest, JsonWrongTypeIsInvalidArgument) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec(R"({"model": {"layers": "two"}})", JobSpecFormat::kJson);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobSpecIoTest, JsonSyntaxErrorIsInvalidArgument) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(R"({"name": "x",)", JobSpecFormat::kJson);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobSpecIoTest, FileErrorsNameTheFile) {
  const std::string missing = ::testing::TempDir() + "/no_such_spec.yaml";
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(missing);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(StartsWith(missing + ": "), HasSubstr("No such file")));

  const std::string bad = WriteTempFile("bad_spec.yaml", "model:\n  heads: x\n");
  spec = ReadJobSpecFile(bad);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              StartsWith(bad + ": line 2, column 10: model.heads"));

  const std::string empty = WriteTempFile("empty_spec.yaml", "# nothing\n");
  spec = ReadJobSpecFile(empty);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("empty"));

  spec = ReadJobSpecFile(::testing::TempDir());  // a directory
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), StartsWith(::testing::TempDir()));
}

TEST(JobSpecIoTest, UntypedYamlToJsonKeepsScalarTypes) {
  absl::StatusOr<std::string> json = YamlToJson(
      "a: 1\nb: 1.5e-3\nc: true\nd: ~\ne: \"7\"\nf: hello \"q\"\ng: [x, 2]\n"
      "h: .inf\n",
      nullptr);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json, R"({"a":1,"b":1.5e-3,"c":true,"d":null,"e":"7",)"
                   R"("f":"hello \"q\"","g":["x",2],"h":"Infinity"})");
}

TEST(JobSpecIoTest, ToJsonRoundTripsAndHonoursMultiline) {
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(DemoPath("demo.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string compact = ToJson(*spec, /*multiline=*/false);
  EXPECT_EQ(compact.find('\n'), std::string::npos);
  EXPECT_THAT(compact, HasSubstr("\"vocabSize\":256"));
  const std::string pretty = ToJson(*spec, /*multiline=*/true);
  EXPECT_NE(pretty.find('\n'), std::string::npos);
  EXPECT_NE(pretty.back(), '\n');
  absl::StatusOr<v1::JobSpec> back = ParseJobSpec(pretty, JobSpecFormat::kJson);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *back));
}

TEST(JobSpecIoTest, ToJsonPrintsZeroFieldsForScripts) {
  v1::Job job;
  job.set_job_id("j1");
  const std::string json = ToJson(job, /*multiline=*/false);
  EXPECT_THAT(json, AllOf(HasSubstr("\"jobId\":\"j1\""), HasSubstr("\"generation\":\"0\""),
                          HasSubstr("\"state\":\"JOB_STATE_UNSPECIFIED\"")));
}

}  // namespace
}  // namespace cohort
