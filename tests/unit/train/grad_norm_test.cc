#include "worker/train/grad_norm.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace cohort::train {
namespace {

TEST(SumOfSquaresTest, AccumulatesInDouble) {
  // 1e4^2 = 1e8 swallows later 1s in float; in double every one counts.
  std::vector<float> x(1001, 1.0f);
  x[0] = 1e4f;
  EXPECT_EQ(SumOfSquares(x.data(), x.size(), 2), 1e8 + 1000);
  EXPECT_EQ(SumOfSquares(x.data(), 0, 2), 0.0);
}

TEST(SumOfSquaresTest, BitwiseIndependentOfThreadCountAcrossChunks) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(3 * kSumOfSquaresChunk + 17);
  for (float& v : x) v = dist(rng);
  const double one = SumOfSquares(x.data(), x.size(), 1);
  for (int threads : {2, 3, 8}) {
    const double other = SumOfSquares(x.data(), x.size(), threads);
    EXPECT_EQ(std::memcmp(&one, &other, sizeof(double)), 0) << threads;
  }
  double serial = 0.0;
  for (float v : x) serial += static_cast<double>(v) * v;
  EXPECT_NEAR(one, serial, 1e-9 * serial);
}

TEST(ClipScaleTest, MatchesTorchClipGradNorm) {
  EXPECT_DOUBLE_EQ(ClipScale(2.0, 1.0), 1.0 / (2.0 + 1e-6));
  EXPECT_DOUBLE_EQ(ClipScale(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(ClipScale(1.0, 1.0), 1.0 / (1.0 + 1e-6));  // torch scales at the boundary too
  EXPECT_DOUBLE_EQ(ClipScale(100.0, 0.0), 1.0);               // disabled
  EXPECT_DOUBLE_EQ(ClipScale(NAN, 1.0), 1.0);
}

TEST(ScaleInPlaceTest, ScalesEveryElement) {
  std::vector<float> x = {1.0f, -2.0f, 3.5f};
  ScaleInPlace(x.data(), x.size(), 0.5f, 2);
  EXPECT_EQ(x, (std::vector<float>{0.5f, -1.0f, 1.75f}));
}

}  // namespace
}  // namespace cohort::train
