// Regressions found with fuzz/job_spec_fuzzer.cc (docs/fuzzing.md). The
// input is in fuzz/corpus/job_spec_fuzzer/regression-*.

#include <string>

#include "common/job_spec/io.h"
#include "common/job_spec/validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort {
namespace {

using ::testing::HasSubstr;

// model.context_length = INT32_MAX with the default 1,000,000 synthetic
// tokens: the message "... context_length+1 = N" computed INT32_MAX + 1 in
// int (UBSan: signed integer overflow). The spec is refused with a message.
TEST(JobSpecValidatorFuzzRegressionTest, ContextLengthInt32Max) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec(R"({"name":"a","model":{"contextLength":2147483647},"data":{"synthetic":{}}})",
                   JobSpecFormat::kJson);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(*spec);
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(normalized.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(normalized.status().message(),
              HasSubstr("model.context_length: 2147483647 exceeds the limit of 1048576"));
  EXPECT_THAT(normalized.status().message(),
              HasSubstr("data.synthetic.tokens: 1000000 tokens hold no sample of "
                        "context_length+1 = 2147483648 tokens"));
}

}  // namespace
}  // namespace cohort
