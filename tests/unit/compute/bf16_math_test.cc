// bf16_math.h: the conversions the cuDNN attention's kernels apply per
// element, run on the CPU.

#include "worker/compute/bf16_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace cohort::compute::kernel_math {
namespace {

TEST(Bf16MathTest, WideningIsExactAndNarrowingRoundsToNearestEven) {
  EXPECT_EQ(Bf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatOfBf16(0x3f80), 1.0f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even 1.
  EXPECT_EQ(Bf16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(Bf16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above the halfway point rounds up.
  EXPECT_EQ(Bf16Bits(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(Bf16Bits(-2.0f), 0xc000);
}

TEST(Bf16MathTest, EveryBf16SurvivesTheRoundTrip) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = FloatOfBf16(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(FloatOfBf16(Bf16Bits(value))));
    } else {
      ASSERT_EQ(Bf16Bits(value), bits) << bits;
    }
  }
}

TEST(Bf16MathTest, OverflowGoesToInfinityAndNanStaysNan) {
  EXPECT_EQ(FloatOfBf16(Bf16Bits(std::numeric_limits<float>::max())),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bf16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
  // A NaN whose payload sits in the low half only would truncate to
  // infinity; it must stay NaN.
  const float low_payload_nan = FloatOfBits(0x7f800001u);
  EXPECT_TRUE(std::isnan(FloatOfBf16(Bf16Bits(low_payload_nan))));
}

TEST(Bf16MathTest, AddBf16AccumulatesTheWidenedGradient) {
  EXPECT_EQ(AddBf16(0.5f, Bf16Bits(0.25f)), 0.75f);
  const float acc = 1e-3f;
  EXPECT_EQ(AddBf16(acc, Bf16Bits(3.0f)), acc + 3.0f);
}

}  // namespace
}  // namespace cohort::compute::kernel_math
