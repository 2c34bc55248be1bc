// Regressions found by fuzz/job_spec_fuzzer.cc (docs/fuzzing.md). The
// fuzzer's inputs are in fuzz/corpus/job_spec_fuzzer/regression-*.

#include <string>

#include "common/job_spec/io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort {
namespace {

using ::testing::HasSubstr;

// A YAML job spec that gives a field twice (the fuzzer spliced two copies
// of demo.yaml) parsed, silently keeping the last value: a second
// `parallelism:` block replaced the first whole. YAML keys are unique; the
// spec is refused, naming both places.
TEST(JobSpecIoFuzzRegressionTest, YamlFieldGivenTwiceIsRefused) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("name: demo\nsteps: 400\nsteps: 500\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr("line 3, column 1: field \"steps\" is given twice (first at line 2, "
                        "column 1)"));
}

TEST(JobSpecIoFuzzRegressionTest, NestedFieldGivenTwiceUnderBothSpellingsIsRefused) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(
      "name: demo\nmodel:\n  vocab_size: 256\n  vocabSize: 512\n", JobSpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr("line 4, column 3: field \"vocabSize\" in model is given twice"));
}

TEST(JobSpecIoFuzzRegressionTest, DistinctFieldsStillParse) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec("name: demo\nsteps: 5\nmodel: {layers: 2, heads: 4}\n", JobSpecFormat::kYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->steps(), 5);
  EXPECT_EQ(spec->model().heads(), 4);
}

}  // namespace
}  // namespace cohort
