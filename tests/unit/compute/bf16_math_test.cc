// bf16_math.h: the conversions per element (rounding, and the activation
// storage's Widen / Narrow / Store / Accumulate), and kernel_math.h's row
// functions over bf16 storage, which the CUDA kernels run on the device, all
// run on the CPU.

#include "worker/compute/bf16_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "worker/compute/kernel_math.h"

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

TEST(Bf16StorageTest, NarrowRoundsToNearestEvenAndWidenIsExact) {
  const float x = 1.0f + 3 * std::ldexp(1.0f, -8);  // a tie between two bf16s: up to the even one
  EXPECT_EQ(Narrow<Bf16>(x).bits, Bf16Bits(x));
  EXPECT_EQ(Widen(Narrow<Bf16>(x)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(Stored<Bf16>(x), 1.0f + std::ldexp(1.0f, -6));
  // fp32 storage keeps every bit.
  const float y = 1.0f + std::ldexp(1.0f, -20);
  EXPECT_EQ(Narrow<float>(y), y);
  EXPECT_EQ(Stored<float>(y), y);
  Bf16 stored{0};
  Store(&stored, -2.5f);
  EXPECT_EQ(Widen(stored), -2.5f);
}

TEST(Bf16StorageTest, AccumulateAddsInFp32AndRoundsOnce) {
  // bf16's spacing at 1 is 2^-7. Adding 3 * 2^-9 (three quarters of it) in
  // one fp32 addition rounds up to 1 + 2^-7; adding it as 2^-9 then 2^-8
  // with a rounding after each falls back to 1 both times (a quarter, then
  // a tie that goes to the even 1).
  Bf16 acc = Narrow<Bf16>(1.0f);
  Accumulate(&acc, 3 * std::ldexp(1.0f, -9));
  EXPECT_EQ(Widen(acc), 1.0f + std::ldexp(1.0f, -7));
  Bf16 twice = Narrow<Bf16>(1.0f);
  Accumulate(&twice, std::ldexp(1.0f, -9));
  Accumulate(&twice, 2 * std::ldexp(1.0f, -9));
  EXPECT_EQ(Widen(twice), 1.0f) << "two roundings lose what one keeps";
  float exact = 1.0f;
  Accumulate(&exact, 3 * std::ldexp(1.0f, -9));
  EXPECT_EQ(exact, 1.0f + 3 * std::ldexp(1.0f, -9));
}

// Random activations in bf16 storage and the same values widened to fp32.
struct Row {
  std::vector<Bf16> stored;
  std::vector<float> widened;
};

Row RandomRow(int n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  Row row;
  for (int i = 0; i < n; ++i) {
    row.stored.push_back(Narrow<Bf16>(dist(rng)));
    row.widened.push_back(Widen(row.stored.back()));
  }
  return row;
}

uint32_t Bits(float v) { return FloatBits(v); }

// The row functions over bf16 storage compute what they compute over the
// widened fp32 values, bit for bit, for the whole row and each lane's share:
// the kernels' bf16 instantiations do the fp32 kernels' arithmetic.
TEST(Bf16StorageTest, RowFunctionsOverBf16AreTheFp32OnesOnTheWidenedValues) {
  constexpr int kC = 75;
  const Row x = RandomRow(kC, 1, 3.0f), dy = RandomRow(kC, 2, 1.0f);
  const std::vector<float> weight = RandomRow(kC, 3, 1.0f).widened;
  for (const auto& [first, stride] : {std::pair{0, 1}, std::pair{5, 32}}) {
    SCOPED_TRACE(::testing::Message() << "first " << first << " stride " << stride);
    const float sum = StridedSum(x.stored.data(), kC, first, stride);
    EXPECT_EQ(Bits(sum), Bits(StridedSum(x.widened.data(), kC, first, stride)));
    const float mean = RowMean(StridedSum(x.widened.data(), kC, 0, 1), kC);
    EXPECT_EQ(Bits(StridedSquaredDeviation(x.stored.data(), kC, mean, first, stride)),
              Bits(StridedSquaredDeviation(x.widened.data(), kC, mean, first, stride)));
    const LayerNormGradSums got = StridedLayerNormGradSums(
        dy.stored.data(), x.stored.data(), weight.data(), mean, 0.7f, kC, first, stride);
    const LayerNormGradSums want = StridedLayerNormGradSums(
        dy.widened.data(), x.widened.data(), weight.data(), mean, 0.7f, kC, first, stride);
    EXPECT_EQ(Bits(got.dnorm), Bits(want.dnorm));
    EXPECT_EQ(Bits(got.dnorm_norm), Bits(want.dnorm_norm));
    EXPECT_EQ(Bits(StridedMax(x.stored.data(), kC, first, stride)),
              Bits(StridedMax(x.widened.data(), kC, first, stride)));
    const double exp_sum = StridedSumExp(x.stored.data(), kC, 2.0f, first, stride);
    EXPECT_EQ(exp_sum, StridedSumExp(x.widened.data(), kC, 2.0f, first, stride));
  }
  for (int j = 0; j < kC; ++j) {
    EXPECT_EQ(Bits(ShardDlogit(x.stored.data(), j, 70, 3, 4.0f, 0.5f)),
              Bits(ShardDlogit(x.widened.data(), j, 70, 3, 4.0f, 0.5f)))
        << j;
  }
}

// The fused residual + LayerNorm in bf16: each sum stored rounded once, and
// the row sum returned is that of the stored (rounded) values, which the
// LayerNorm then reads back; as ResidualForward's stores and StridedSum.
TEST(Bf16StorageTest, ResidualSumStoresRoundedSumsAndSumsWhatItStored) {
  constexpr int kC = 75;
  const Row a = RandomRow(kC, 4, 2.0f), b = RandomRow(kC, 5, 1.0f);
  for (const auto& [first, stride] : {std::pair{0, 1}, std::pair{3, 32}}) {
    std::vector<Bf16> out(kC, Bf16{0});
    const float sum =
        StridedResidualSum(out.data(), a.stored.data(), b.stored.data(), kC, first, stride);
    bool rounded_any = false;
    for (int c = first; c < kC; c += stride) {
      const float exact = a.widened[c] + b.widened[c];
      EXPECT_EQ(out[c].bits, Bf16Bits(exact)) << c;
      rounded_any |= Widen(out[c]) != exact;
    }
    EXPECT_TRUE(rounded_any) << "no sum needed rounding: the test shows nothing";
    EXPECT_EQ(Bits(sum), Bits(StridedSum(out.data(), kC, first, stride)));
  }
}

}  // namespace
}  // namespace cohort::compute::kernel_math
