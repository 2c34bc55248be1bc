#include "common/job_spec/validator.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "common/enum_names.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace cohort {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A small valid job that leaves every defaulted field at zero.
v1::JobSpec ValidSpec() {
  v1::JobSpec spec;
  spec.set_name("gpt-tiny-1");
  spec.mutable_model()->set_layers(2);
  spec.mutable_model()->set_heads(4);
  spec.mutable_model()->set_width(64);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_model()->set_context_length(32);
  spec.mutable_data()->mutable_synthetic()->set_seed(5);
  spec.mutable_data()->set_seed(1);
  spec.mutable_optimizer()->set_learning_rate(1e-3);
  spec.mutable_optimizer()->set_min_learning_rate(1e-4);
  spec.mutable_optimizer()->set_warmup_steps(10);
  spec.mutable_optimizer()->set_weight_decay(0.1);
  spec.mutable_optimizer()->set_grad_clip(1.0);
  spec.mutable_batch()->set_global_batch_size(8);
  spec.mutable_batch()->set_micro_batch_size(2);
  spec.mutable_parallelism()->set_tensor(2);
  spec.set_steps(100);
  spec.mutable_checkpoint()->set_interval_steps(50);
  return spec;
}

TEST(JobSpecValidatorTest, ValidSpecGetsDefaults) {
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(ValidSpec());
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  v1::JobSpec expected = ValidSpec();
  expected.set_device_kind(v1::DEVICE_KIND_CPU);
  expected.mutable_model()->set_precision(v1::PRECISION_FP32);
  expected.mutable_parallelism()->set_pipeline(1);
  expected.mutable_parallelism()->set_reduction(v1::ParallelismConfig::REDUCTION_DETERMINISTIC);
  expected.mutable_optimizer()->set_beta1(0.9);
  expected.mutable_optimizer()->set_beta2(0.95);
  expected.mutable_optimizer()->set_epsilon(1e-8);
  expected.mutable_elastic()->set_min_workers(2);
  expected.mutable_elastic()->set_max_workers(2);
  expected.mutable_elastic()->set_optimizer_replicas(2);
  expected.mutable_elastic()->set_wait_for_workers_seconds(600);
  expected.mutable_checkpoint()->set_keep_last(3);
  expected.mutable_data()->mutable_synthetic()->set_branching(4);
  expected.mutable_data()->mutable_synthetic()->set_alphabet_size(16);
  expected.mutable_data()->mutable_synthetic()->set_tokens(1000000);
  expected.mutable_data()->mutable_synthetic()->set_order(2);
  std::string diff;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(*normalized, expected)) << diff;
  EXPECT_EQ(MicroBatchesPerStep(*normalized), 4);

  // Normalizing is idempotent.
  absl::StatusOr<v1::JobSpec> again = NormalizeJobSpec(*normalized);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*again, *normalized));
}

TEST(JobSpecValidatorTest, ExplicitValuesAreKept) {
  v1::JobSpec spec = ValidSpec();
  spec.set_device_kind(v1::DEVICE_KIND_GPU);
  spec.mutable_model()->set_precision(v1::PRECISION_TF32);
  spec.mutable_parallelism()->set_pipeline(2);
  spec.mutable_parallelism()->set_reduction(v1::ParallelismConfig::REDUCTION_TRANSPORT);
  spec.mutable_optimizer()->set_beta1(0.8);
  spec.mutable_optimizer()->set_beta2(0.99);
  spec.mutable_optimizer()->set_epsilon(1e-6);
  spec.mutable_elastic()->set_min_workers(5);  // not a multiple of 4: allowed
  spec.mutable_elastic()->set_max_workers(16);
  spec.mutable_elastic()->set_optimizer_replicas(3);
  spec.mutable_elastic()->set_wait_for_workers_seconds(45);
  spec.mutable_checkpoint()->set_keep_last(7);
  spec.mutable_checkpoint()->set_keep_every(1000);
  spec.mutable_data()->mutable_synthetic()->set_branching(2);
  spec.mutable_data()->mutable_synthetic()->set_alphabet_size(8);
  spec.mutable_data()->mutable_synthetic()->set_tokens(5000);
  spec.mutable_data()->mutable_synthetic()->set_order(1);
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*normalized, spec));
}

// Issue 23: model.precision defaults by device kind; the reduced precisions
// are refused for CPU jobs at submit, with the reason.
TEST(JobSpecValidatorTest, PrecisionDefaultsByDeviceAndReducedOnesNeedAGpu) {
  v1::JobSpec gpu = ValidSpec();
  gpu.set_device_kind(v1::DEVICE_KIND_GPU);
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(gpu);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(normalized->model().precision(), v1::PRECISION_BF16);
  for (v1::Precision reduced : {v1::PRECISION_BF16, v1::PRECISION_TF32}) {
    v1::JobSpec cpu = ValidSpec();
    cpu.mutable_model()->set_precision(reduced);
    const absl::Status status = NormalizeJobSpec(cpu).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("model.precision: ", ShortEnumName(reduced),
                                       " needs a GPU job (device_kind GPU); CPU jobs train in "
                                       "FP32")));
  }
  v1::JobSpec unknown = ValidSpec();
  unknown.mutable_model()->set_precision(static_cast<v1::Precision>(9));
  EXPECT_THAT(std::string(NormalizeJobSpec(unknown).status().message()),
              HasSubstr("model.precision: unknown value 9; use FP32, TF32 or BF16"));
}

TEST(JobSpecValidatorTest, AnUnknownReductionIsNamed) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_parallelism()->set_reduction(static_cast<v1::ParallelismConfig::Reduction>(7));
  const absl::Status status = NormalizeJobSpec(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("parallelism.reduction: unknown value 7 (REDUCTION_DETERMINISTIC or "
                        "REDUCTION_TRANSPORT)"));
}

TEST(JobSpecValidatorTest, ShardSourceIsAccepted) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_data()->mutable_shards()->set_pattern("/data/tiny/*.bin");
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(normalized->data().shards().pattern(), "/data/tiny/*.bin");
}

struct BadCase {
  std::string name;
  std::function<void(v1::JobSpec&)> mutate;
  std::string message;  // "field: reason" substring
};

class BadSpecTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadSpecTest, NamesFieldAndReason) {
  v1::JobSpec spec = ValidSpec();
  GetParam().mutate(spec);
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(normalized.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(normalized.status().message()), HasSubstr(GetParam().message));
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

INSTANTIATE_TEST_SUITE_P(
    BadSpecs, BadSpecTest,
    ::testing::Values(
        BadCase{"EmptyName", [](v1::JobSpec& s) { s.set_name(""); }, "name: must not be empty"},
        BadCase{"UpperCaseName", [](v1::JobSpec& s) { s.set_name("Gpt"); },
                "name: \"Gpt\" must match [a-z0-9][a-z0-9-]{0,62}"},
        BadCase{"LeadingDash", [](v1::JobSpec& s) { s.set_name("-gpt"); }, "name: \"-gpt\""},
        BadCase{"NameWithSlash", [](v1::JobSpec& s) { s.set_name("a/b"); }, "name: \"a/b\""},
        BadCase{"LongName", [](v1::JobSpec& s) { s.set_name(std::string(64, 'a')); },
                "at most 63 characters"},
        BadCase{"UnknownDevice",
                [](v1::JobSpec& s) { s.set_device_kind(static_cast<v1::DeviceKind>(9)); },
                "device_kind: unknown value 9"},
        BadCase{"ZeroLayers", [](v1::JobSpec& s) { s.mutable_model()->set_layers(0); },
                "model.layers: must be > 0, got 0"},
        BadCase{"TooManyLayers", [](v1::JobSpec& s) { s.mutable_model()->set_layers(5000); },
                "model.layers: 5000 exceeds the limit of 1024"},
        BadCase{"NegativeWidth", [](v1::JobSpec& s) { s.mutable_model()->set_width(-64); },
                "model.width: must be > 0, got -64"},
        BadCase{"WidthTheEngineCannotHold",
                [](v1::JobSpec& s) {
                  // 4 * C * C = 2149316624 passes int32.
                  s.mutable_model()->set_width(23180);
                  s.mutable_model()->set_heads(4);
                },
                "model.width: 23180 exceeds the limit of 23170"},
        BadCase{"NoWorkerCountIsWholeReplicas",
                [](v1::JobSpec& s) {
                  s.mutable_parallelism()->set_tensor(2);
                  s.mutable_parallelism()->set_pipeline(2);
                  s.mutable_elastic()->set_min_workers(5);
                  s.mutable_elastic()->set_max_workers(7);
                },
                "elastic: no worker count from 5 to 7 (elastic.min_workers to "
                "elastic.max_workers) is a multiple of the 4 workers of one model replica"},
        BadCase{"HugeVocab",
                [](v1::JobSpec& s) { s.mutable_model()->set_vocab_size((1 << 20) + 2); },
                "model.vocab_size: 1048578 exceeds the limit of 1048576"},
        BadCase{"ZeroContext", [](v1::JobSpec& s) { s.mutable_model()->set_context_length(0); },
                "model.context_length: must be > 0"},
        BadCase{"HeadsDoNotDivideWidth", [](v1::JobSpec& s) { s.mutable_model()->set_heads(6); },
                "model.heads: 6 attention heads do not divide width 64 (model.width)"},
        BadCase{"TensorDoesNotDivideHeads",
                [](v1::JobSpec& s) {
                  s.mutable_model()->set_heads(8);
                  s.mutable_model()->set_vocab_size(264);
                  s.mutable_parallelism()->set_tensor(3);
                },
                "parallelism.tensor: tensor parallel 3 does not divide 8 attention heads "
                "(model.heads)"},
        BadCase{"TensorDoesNotDividePaddedVocab",
                [](v1::JobSpec& s) {
                  s.mutable_model()->set_heads(6);
                  s.mutable_model()->set_width(96);
                  s.mutable_model()->set_vocab_size(255);
                  s.mutable_parallelism()->set_tensor(3);
                },
                "parallelism.tensor: tensor parallel 3 does not divide the padded vocabulary "
                "256 (model.vocab_size 255 rounded up to a multiple of 128)"},
        BadCase{"NegativeTensor", [](v1::JobSpec& s) { s.mutable_parallelism()->set_tensor(-1); },
                "parallelism.tensor: must be > 0, got -1"},
        BadCase{"PipelineAboveLayers",
                [](v1::JobSpec& s) { s.mutable_parallelism()->set_pipeline(3); },
                "parallelism.pipeline: pipeline parallel 3 exceeds 2 layers (model.layers)"},
        BadCase{"ZeroGlobalBatch",
                [](v1::JobSpec& s) { s.mutable_batch()->set_global_batch_size(0); },
                "batch.global_batch_size: must be > 0, got 0"},
        BadCase{"ZeroMicroBatch", [](v1::JobSpec& s) { s.mutable_batch()->set_micro_batch_size(0); },
                "batch.micro_batch_size: must be > 0, got 0"},
        BadCase{"MicroDoesNotDivideGlobal",
                [](v1::JobSpec& s) { s.mutable_batch()->set_micro_batch_size(3); },
                "batch.micro_batch_size: 3 does not divide global_batch_size 8"},
        BadCase{"ZeroSteps", [](v1::JobSpec& s) { s.set_steps(0); }, "steps: must be > 0, got 0"},
        BadCase{"ZeroLearningRate",
                [](v1::JobSpec& s) { s.mutable_optimizer()->set_learning_rate(0); },
                "optimizer.learning_rate: must be > 0, got 0"},
        BadCase{"NaNLearningRate",
                [](v1::JobSpec& s) { s.mutable_optimizer()->set_learning_rate(kNaN); },
                "optimizer.learning_rate: must be a finite number"},
        BadCase{"MinLrAboveLr",
                [](v1::JobSpec& s) { s.mutable_optimizer()->set_min_learning_rate(0.01); },
                "optimizer.min_learning_rate: 0.01 exceeds learning_rate 0.001"},
        BadCase{"NegativeMinLr",
                [](v1::JobSpec& s) { s.mutable_optimizer()->set_min_learning_rate(-1); },
                "optimizer.min_learning_rate: must be >= 0, got -1"},
        BadCase{"NegativeWarmup",
                [](v1::JobSpec& s) { s.mutable_optimizer()->set_warmup_steps(-1); },
                "optimizer.warmup_steps: must be >= 0, got -1"},
        BadCase{"WarmupAboveSteps",
                [](v1::JobSpec& s) { s.mutable_optimizer()->set_warmup_steps(101); },
                "optimizer.warmup_steps: 101 exceeds the 100 steps of the job"},
        BadCase{"NegativeWeightDecay",
                [](v1::JobSpec& s) { s.mutable_optimizer()->set_weight_decay(-0.1); },
                "optimizer.weight_decay: must be >= 0, got -0.1"},
        BadCase{"Beta1One", [](v1::JobSpec& s) { s.mutable_optimizer()->set_beta1(1.0); },
                "optimizer.beta1: must be in [0, 1), got 1"},
        BadCase{"NegativeBeta2", [](v1::JobSpec& s) { s.mutable_optimizer()->set_beta2(-0.5); },
                "optimizer.beta2: must be in [0, 1), got -0.5"},
        BadCase{"NegativeEpsilon", [](v1::JobSpec& s) { s.mutable_optimizer()->set_epsilon(-1); },
                "optimizer.epsilon: must be > 0, got -1"},
        BadCase{"InfiniteGradClip",
                [](v1::JobSpec& s) { s.mutable_optimizer()->set_grad_clip(kInf); },
                "optimizer.grad_clip: must be a finite number"},
        BadCase{"NoDataSource", [](v1::JobSpec& s) { s.mutable_data()->clear_source(); },
                "data: no source: set data.synthetic or data.shards"},
        BadCase{"EmptyShardPattern",
                [](v1::JobSpec& s) { s.mutable_data()->mutable_shards()->clear_pattern(); },
                "data.shards.pattern: must not be empty"},
        // Issue 21: a 4 MiB pattern made Jobs.List unreadable, for good.
        BadCase{"HugeShardPattern",
                [](v1::JobSpec& s) {
                  s.mutable_data()->mutable_shards()->set_pattern(std::string(4 << 20, 'x'));
                },
                "data.shards.pattern: <4194304 bytes, not shown> must be a path glob of at most "
                "4096 bytes"},
        BadCase{"ShardPatternWithNewline",
                [](v1::JobSpec& s) { s.mutable_data()->mutable_shards()->set_pattern("/d/*.bin\nx"); },
                "data.shards.pattern: <10 bytes, not shown>"},
        BadCase{"HugeName", [](v1::JobSpec& s) { s.set_name(std::string(1 << 20, 'a')); },
                "name: <1048576 bytes, not shown> must match"},
        BadCase{"NegativeBranching",
                [](v1::JobSpec& s) {
                  s.mutable_data()->mutable_synthetic()->set_branching(-2);
                },
                "data.synthetic.branching: must be >= 1, got -2"},
        BadCase{"BranchingAboveAlphabet",
                [](v1::JobSpec& s) {
                  s.mutable_data()->mutable_synthetic()->set_branching(17);
                },
                "data.synthetic.branching: 17 successors per context exceed 16 symbols"},
        BadCase{"AlphabetAboveVocab",
                [](v1::JobSpec& s) {
                  s.mutable_data()->mutable_synthetic()->set_alphabet_size(300);
                },
                "data.synthetic.alphabet_size: 300 symbols exceed model.vocab_size 256"},
        BadCase{"BadOrder",
                [](v1::JobSpec& s) { s.mutable_data()->mutable_synthetic()->set_order(3); },
                "data.synthetic.order: must be 1 or 2, got 3"},
        BadCase{"TooFewSyntheticTokens",
                [](v1::JobSpec& s) { s.mutable_data()->mutable_synthetic()->set_tokens(10); },
                "data.synthetic.tokens: 10 tokens hold no sample"},
        BadCase{"MinBelowReplica",
                [](v1::JobSpec& s) { s.mutable_elastic()->set_min_workers(1); },
                "elastic.min_workers: 1 is fewer than the 2 workers of one model replica"},
        BadCase{"MaxBelowMin",
                [](v1::JobSpec& s) {
                  s.mutable_elastic()->set_min_workers(4);
                  s.mutable_elastic()->set_max_workers(3);
                },
                "elastic.max_workers: 3 is less than min_workers 4"},
        BadCase{"MaxAboveLimit",
                [](v1::JobSpec& s) { s.mutable_elastic()->set_max_workers(100002); },
                "elastic.max_workers: 100002 exceeds the limit of 100000"},
        BadCase{"NegativeMin", [](v1::JobSpec& s) { s.mutable_elastic()->set_min_workers(-1); },
                "elastic.min_workers: must be >= 0, got -1"},
        BadCase{"TooManyOptimizerReplicas",
                [](v1::JobSpec& s) { s.mutable_elastic()->set_optimizer_replicas(9); },
                "elastic.optimizer_replicas: must be in [1, 8] (0 means 2), got 9"},
        BadCase{"NegativeOptimizerReplicas",
                [](v1::JobSpec& s) { s.mutable_elastic()->set_optimizer_replicas(-1); },
                "elastic.optimizer_replicas: must be in [1, 8]"},
        BadCase{"NegativeWaitForWorkers",
                [](v1::JobSpec& s) { s.mutable_elastic()->set_wait_for_workers_seconds(-5); },
                "elastic.wait_for_workers_seconds: must be >= 0 (0 means 600), got -5"},
        BadCase{"NoDpDividesMicroBatches",
                [](v1::JobSpec& s) {
                  // 4 micro-batches; 6..6 workers of 2 per replica: dp 3 only,
                  // which the transport's reduction cannot split.
                  s.mutable_elastic()->set_min_workers(6);
                  s.mutable_elastic()->set_max_workers(6);
                  s.mutable_parallelism()->set_reduction(
                      v1::ParallelismConfig::REDUCTION_TRANSPORT);
                },
                "elastic: no data parallel degree in [3, 3] (6 to 6 workers of 2 per replica) "
                "divides the 4 micro-batches per step (batch.global_batch_size / "
                "batch.micro_batch_size) as parallelism.reduction TRANSPORT needs"},
        BadCase{"MoreDataRanksThanMicroBatches",
                [](v1::JobSpec& s) {
                  // 4 micro-batches; 10..10 workers of 2 per replica: dp 5.
                  s.mutable_elastic()->set_min_workers(10);
                  s.mutable_elastic()->set_max_workers(10);
                },
                "elastic: no data parallel degree in [5, 5] (10 to 10 workers of 2 per replica) "
                "is at most the 4 micro-batches per step"},
        BadCase{"NegativeInterval",
                [](v1::JobSpec& s) { s.mutable_checkpoint()->set_interval_steps(-5); },
                "checkpoint.interval_steps: must be >= 0"},
        BadCase{"NegativeKeepLast",
                [](v1::JobSpec& s) { s.mutable_checkpoint()->set_keep_last(-1); },
                "checkpoint.keep_last: must be >= 0"},
        BadCase{"NegativeKeepEvery",
                [](v1::JobSpec& s) { s.mutable_checkpoint()->set_keep_every(-1); },
                "checkpoint.keep_every: must be >= 0"},
        BadCase{"ResumeStepWithoutJob",
                [](v1::JobSpec& s) { s.mutable_checkpoint()->set_resume_from_step(10); },
                "checkpoint.resume_from_step: is set but checkpoint.resume_from_job is empty"},
        BadCase{"NegativeResumeStep",
                [](v1::JobSpec& s) {
                  s.mutable_checkpoint()->set_resume_from_job("base-1");
                  s.mutable_checkpoint()->set_resume_from_step(-2);
                },
                "checkpoint.resume_from_step: must be >= 0"},
        BadCase{"ResumeFromBadJobId",
                [](v1::JobSpec& s) { s.mutable_checkpoint()->set_resume_from_job("Base/1"); },
                "checkpoint.resume_from_job: \"Base/1\" is not a job id"},
        BadCase{"ValidationWithoutData",
                [](v1::JobSpec& s) { s.mutable_data()->mutable_validation()->set_batches(2); },
                "data.validation: set exactly one of pattern (held-out shards) and "
                "held_out_fraction"},
        BadCase{"ValidationWithBothSources",
                [](v1::JobSpec& s) {
                  s.mutable_data()->mutable_validation()->set_pattern("/d/val_*.bin");
                  s.mutable_data()->mutable_validation()->set_held_out_fraction(0.1);
                },
                "data.validation: set exactly one"},
        BadCase{"HeldOutFractionTooLarge",
                [](v1::JobSpec& s) {
                  s.mutable_data()->mutable_validation()->set_held_out_fraction(0.75);
                },
                "data.validation.held_out_fraction: must be in (0, 0.5], got 0.75"},
        BadCase{"NegativeValidationInterval",
                [](v1::JobSpec& s) {
                  s.mutable_data()->mutable_validation()->set_held_out_fraction(0.1);
                  s.mutable_data()->mutable_validation()->set_interval_steps(-1);
                },
                "data.validation.interval_steps: must be >= 0"},
        BadCase{"TooManyValidationBatches",
                [](v1::JobSpec& s) {
                  s.mutable_data()->mutable_validation()->set_held_out_fraction(0.1);
                  s.mutable_data()->mutable_validation()->set_batches(10001);
                },
                "data.validation.batches: must be in [0, 10000]"},
        BadCase{"InitFromWithResume",
                [](v1::JobSpec& s) {
                  s.mutable_checkpoint()->set_init_from("/m/gpt2.safetensors");
                  s.mutable_checkpoint()->set_resume_from_job("base-1");
                },
                "checkpoint.init_from: is set with checkpoint.resume_from_job"},
        BadCase{"InitFromWithAControlCharacter",
                [](v1::JobSpec& s) { s.mutable_checkpoint()->set_init_from("a\nb"); },
                "checkpoint.init_from: "}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(JobSpecValidatorTest, ValidationBatchesDefaultToFour) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_data()->mutable_validation()->set_held_out_fraction(0.1);
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(normalized->data().validation().batches(), 4);
  EXPECT_EQ(normalized->data().validation().interval_steps(), 0);
}

TEST(JobSpecValidatorTest, UnknownFieldsAreNotStored) {
  v1::JobSpec spec = ValidSpec();
  spec.GetReflection()->MutableUnknownFields(&spec)->AddLengthDelimited(999, std::string(1 << 20, 'u'));
  ASSERT_GT(spec.ByteSizeLong(), 1u << 20);
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_LT(normalized->ByteSizeLong(), 4096u);
}

TEST(JobSpecValidatorTest, ReportsEveryErrorTogether) {
  v1::JobSpec spec = ValidSpec();
  spec.set_name("Bad Name");
  spec.mutable_model()->set_heads(8);
  spec.mutable_parallelism()->set_tensor(3);
  spec.set_steps(0);
  spec.mutable_optimizer()->set_learning_rate(-1);
  spec.mutable_data()->clear_source();
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(normalized.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(normalized.status().message());
  EXPECT_THAT(message, HasSubstr("name: \"Bad Name\""));
  EXPECT_THAT(message, HasSubstr("; parallelism.tensor: tensor parallel 3 does not divide 8 "
                                 "attention heads (model.heads)"));
  EXPECT_THAT(message, HasSubstr("; steps: must be > 0, got 0"));
  EXPECT_THAT(message, HasSubstr("; optimizer.learning_rate: must be > 0, got -1"));
  EXPECT_THAT(message, HasSubstr("; data: no source"));
  // Steps are unknown, so warmup is not compared with them.
  EXPECT_THAT(message, Not(HasSubstr("warmup")));
}

TEST(JobSpecValidatorTest, DependentChecksSkipInvalidInputs) {
  // Zero heads is reported once, not again as "does not divide".
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_heads(0);
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(std::string(normalized.status().message()), "model.heads: must be > 0, got 0");
}

TEST(JobSpecValidatorTest, GpuJobsAndElasticRangesThatFit) {
  v1::JobSpec spec = ValidSpec();
  spec.set_device_kind(v1::DEVICE_KIND_GPU);
  // 4 micro-batches, 2 per replica, 4..10 workers: dp 2 and 4 both divide.
  spec.mutable_elastic()->set_min_workers(4);
  spec.mutable_elastic()->set_max_workers(10);
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(normalized->device_kind(), v1::DEVICE_KIND_GPU);
}

TEST(JobSpecValidatorTest, MicroBatchesPerStep) {
  v1::JobSpec spec;
  spec.mutable_batch()->set_global_batch_size(64);
  spec.mutable_batch()->set_micro_batch_size(4);
  EXPECT_EQ(MicroBatchesPerStep(spec), 16);
  spec.mutable_batch()->set_micro_batch_size(0);
  EXPECT_EQ(MicroBatchesPerStep(spec), 0);
}

}  // namespace
}  // namespace cohort
