// TrainingConfigFromSpec: what the engine takes from a job spec, and what it
// refuses on the CPU (issue 23: the reduced precisions and GPU jobs).

#include "worker/train/training_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/job_spec/validator.h"
#include "common/layout/mesh_layout.h"
#include "tests/testing/job_specs.h"

namespace cohort::train {
namespace {

using ::testing::HasSubstr;

TEST(TrainingConfigTest, ACpuJobTrainsInFp32) {
  v1::JobSpec spec = testing::SmallJobSpec("config", 1, 1, 1);
  for (v1::Precision precision : {v1::PRECISION_UNSPECIFIED, v1::PRECISION_FP32}) {
    spec.mutable_model()->set_precision(precision);
    absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec, {});
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->precision, compute::Precision::kFp32);
  }
  for (v1::Precision reduced : {v1::PRECISION_TF32, v1::PRECISION_BF16}) {
    spec.mutable_model()->set_precision(reduced);
    const absl::Status status = TrainingConfigFromSpec(spec, {}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("model.precision: "));
    EXPECT_THAT(std::string(status.message()), HasSubstr("needs a GPU"));
  }
}

TEST(TrainingConfigTest, AGpuJobRunsOnTheCudaBackendInItsPrecision) {
  v1::JobSpec spec = testing::SmallJobSpec("config", 1, 1, 1);
  spec.set_device_kind(v1::DEVICE_KIND_GPU);
  spec.mutable_parallelism()->set_tensor(2);  // every layout (host staging)
  spec.mutable_parallelism()->set_pipeline(2);
  spec.mutable_elastic()->set_min_workers(4);  // one replica of that layout
  spec.mutable_elastic()->set_max_workers(4);
  for (auto [precision, expected] :
       {std::pair{v1::PRECISION_FP32, compute::Precision::kFp32},
        std::pair{v1::PRECISION_TF32, compute::Precision::kTf32},
        std::pair{v1::PRECISION_BF16, compute::Precision::kBf16},
        // Unspecified: bf16, the GPU default (as the coordinator fills in).
        std::pair{v1::PRECISION_UNSPECIFIED, compute::Precision::kBf16}}) {
    spec.mutable_model()->set_precision(precision);
    const absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec, layout::MicroBatchShares(MicroBatchesPerStep(spec), 2));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->backend, compute::BackendKind::kCuda);
    EXPECT_EQ(config->precision, expected) << v1::Precision_Name(precision);
  }
}

TEST(TrainingConfigTest, TakesThePlansSplitOfTheMicroBatchesAndRefusesOneThatIsNot) {
  v1::JobSpec spec = testing::SmallJobSpec("config", 1, 1, 3);  // 8 micro-batches
  absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec, {3, 3, 2});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->micro_batch_shares, (std::vector<int>{3, 3, 2}));
  config = TrainingConfigFromSpec(spec, {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->shares(), (std::vector<int>{8}));  // one data rank
  for (const std::vector<int>& bad : {std::vector<int>{4, 3}, std::vector<int>{8, 0},
                                      std::vector<int>{5, 4}}) {
    const absl::Status status = TrainingConfigFromSpec(spec, bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.size();
    EXPECT_THAT(std::string(status.message()), HasSubstr("Mesh.micro_batches"));
  }
  // The transport's reduction needs the same share on every rank.
  spec.mutable_parallelism()->set_reduction(v1::ParallelismConfig::REDUCTION_TRANSPORT);
  EXPECT_FALSE(TrainingConfigFromSpec(spec, {3, 3, 2}).ok());
  EXPECT_TRUE(TrainingConfigFromSpec(spec, {4, 4}).ok());
}

}  // namespace
}  // namespace cohort::train
