#include "worker/train/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace cohort::train {
namespace {

TEST(LrScheduleTest, WarmupThenCosineToMinimum) {
  const LrScheduleOptions o{.max_lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 10, .total_steps = 110};
  ASSERT_TRUE(ValidateLrSchedule(o).ok());
  EXPECT_DOUBLE_EQ(LearningRate(o, 0), 6e-4 / 10);  // step 0 already trains
  EXPECT_DOUBLE_EQ(LearningRate(o, 4), 6e-4 * 5 / 10);
  EXPECT_DOUBLE_EQ(LearningRate(o, 9), 6e-4);                // warmup ends at the peak
  EXPECT_DOUBLE_EQ(LearningRate(o, 10), 6e-4);               // cosine starts at the peak
  EXPECT_DOUBLE_EQ(LearningRate(o, 60), (6e-4 + 6e-5) / 2);  // halfway
  EXPECT_DOUBLE_EQ(LearningRate(o, 35), 6e-5 + 0.5 * (1 + std::cos(M_PI / 4)) * (6e-4 - 6e-5));
  EXPECT_GT(LearningRate(o, 109), 6e-5);
  EXPECT_DOUBLE_EQ(LearningRate(o, 110), 6e-5);
  EXPECT_DOUBLE_EQ(LearningRate(o, 1000), 6e-5);
  for (int s = 10; s < 110; ++s) EXPECT_LE(LearningRate(o, s + 1), LearningRate(o, s)) << s;
}

TEST(LrScheduleTest, NoWarmupStartsAtPeak) {
  const LrScheduleOptions o{.max_lr = 1.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4};
  EXPECT_DOUBLE_EQ(LearningRate(o, 0), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 2), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(o, 4), 0.0);
}

TEST(LrScheduleTest, ValidationNamesTheField) {
  struct Case {
    LrScheduleOptions options;
    const char* field;
  };
  const Case cases[] = {
      {{.max_lr = -1.0}, "max_lr"},
      {{.max_lr = NAN}, "max_lr"},
      {{.max_lr = 1.0, .min_lr = 2.0}, "min_lr"},
      {{.max_lr = 1.0, .min_lr = -0.1}, "min_lr"},
      {{.max_lr = 1.0, .warmup_steps = -1}, "warmup_steps"},
      {{.max_lr = 1.0, .total_steps = 0}, "total_steps"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ValidateLrSchedule(c.options);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace cohort::train
