#include "worker/comm/reduce.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace cohort::comm {
namespace {

TEST(ReduceTest, Float32SumAndMaxElementwise) {
  const std::vector<float> a = {1.0f, -2.0f, 3.5f, 0.0f};
  const std::vector<float> b = {0.5f, 4.0f, -1.0f, -0.0f};
  std::vector<float> out(4);
  ReduceInto(DataType::kFloat32, ReduceOp::kSum, a.data(), b.data(), out.data(), 4);
  EXPECT_EQ(out, (std::vector<float>{1.5f, 2.0f, 2.5f, 0.0f}));
  ReduceInto(DataType::kFloat32, ReduceOp::kMax, a.data(), b.data(), out.data(), 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 4.0f);
  EXPECT_EQ(out[2], 3.5f);
}

TEST(ReduceTest, Float64SumAndMax) {
  const std::vector<double> a = {1e300, -2.0, 0.1};
  const std::vector<double> b = {1e300, 4.0, 0.2};
  std::vector<double> out(3);
  ReduceInto(DataType::kFloat64, ReduceOp::kSum, a.data(), b.data(), out.data(), 3);
  EXPECT_EQ(out, (std::vector<double>{2e300, 2.0, 0.1 + 0.2}));
  ReduceInto(DataType::kFloat64, ReduceOp::kMax, a.data(), b.data(), out.data(), 3);
  EXPECT_EQ(out, (std::vector<double>{1e300, 4.0, 0.2}));
  EXPECT_EQ(DataTypeSize(DataType::kFloat64), 8u);
}

TEST(ReduceTest, InPlaceAliasingOutput) {
  std::vector<float> a(1000), b(1000);
  for (int i = 0; i < 1000; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = static_cast<float>(2 * i);
  }
  ReduceInto(DataType::kFloat32, ReduceOp::kSum, a.data(), b.data(), a.data(), 1000);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a[i], static_cast<float>(3 * i));
}

TEST(ReduceTest, MaxPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> a = {nan, 1.0f};
  const std::vector<float> b = {1.0f, nan};
  std::vector<float> out(2);
  ReduceInto(DataType::kFloat32, ReduceOp::kMax, a.data(), b.data(), out.data(), 2);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
}

TEST(ReduceTest, IntegerSumsWrapExactly) {
  const std::vector<int32_t> a = {std::numeric_limits<int32_t>::max(), -5};
  const std::vector<int32_t> b = {1, 7};
  std::vector<int32_t> out(2);
  ReduceInto(DataType::kInt32, ReduceOp::kSum, a.data(), b.data(), out.data(), 2);
  EXPECT_EQ(out[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(out[1], 2);
  const std::vector<uint8_t> c = {250, 3}, d = {10, 4};
  std::vector<uint8_t> u(2);
  ReduceInto(DataType::kUInt8, ReduceOp::kSum, c.data(), d.data(), u.data(), 2);
  EXPECT_EQ(u, (std::vector<uint8_t>{4, 7}));
  const std::vector<int64_t> e = {-3, int64_t{1} << 40}, f = {-4, 5};
  std::vector<int64_t> m(2);
  ReduceInto(DataType::kInt64, ReduceOp::kMax, e.data(), f.data(), m.data(), 2);
  EXPECT_EQ(m, (std::vector<int64_t>{-3, int64_t{1} << 40}));
}

TEST(ReduceTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: ties go to even (1).
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6: goes up.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(BFloat16ToFloat(0x3f82), 1.0f + 2.0f / 128);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  const std::vector<uint16_t> a = {FloatToBFloat16(1.5f)}, b = {FloatToBFloat16(2.25f)};
  std::vector<uint16_t> out(1);
  ReduceInto(DataType::kBFloat16, ReduceOp::kSum, a.data(), b.data(), out.data(), 1);
  EXPECT_EQ(BFloat16ToFloat(out[0]), 3.75f);
}

TEST(ReduceTest, HalfConversionsRoundTripAndRound) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // tie to even (2)
  // 1 + 2^-11: half-way between 1 and 1 + 2^-10, ties to even.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Every finite half survives a round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
}

}  // namespace
}  // namespace cohort::comm
