// The views the cuDNN attention hands cuDNN (sdpa_layout.h) address exactly
// the elements the model's layout says: q, k, v of the (B,T,3C) qkv, the
// (B,T,C) output, the statistics, and the attention state's parts.

#include "worker/compute/sdpa_layout.h"

#include <gtest/gtest.h>

#include <set>

namespace cohort::compute::sdpa {
namespace {

int64_t Address(const View& v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return v.offset + i0 * v.strides[0] + i1 * v.strides[1] + i2 * v.strides[2] + i3 * v.strides[3];
}

TEST(SdpaLayoutTest, QkvViewsAddressTheModelsHeadLayout) {
  const Shape s{2, 5, 3, 8};
  const int64_t C = s.C();
  for (Part part : {Part::kQ, Part::kK, Part::kV}) {
    const View v = QkvView(s, part);
    EXPECT_EQ(v.dims, (std::array<int64_t, 4>{2, 3, 5, 8}));
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.NH; ++h)
        for (int t = 0; t < s.T; ++t)
          for (int d = 0; d < s.hs; ++d) {
            // The model: qkv[b][t][part * C + h * hs + d] (backend.h).
            const int64_t expected =
                (int64_t{b} * s.T + t) * 3 * C + static_cast<int>(part) * C + h * s.hs + d;
            ASSERT_EQ(Address(v, b, h, t, d), expected);
          }
  }
}

TEST(SdpaLayoutTest, TheTransposedKeyIsTheSameMemory) {
  const Shape s{2, 5, 3, 8};
  const View k = QkvView(s, Part::kK), kt = KeyTransposedView(s);
  EXPECT_EQ(kt.dims, (std::array<int64_t, 4>{2, 3, 8, 5}));
  for (int t = 0; t < s.T; ++t)
    for (int d = 0; d < s.hs; ++d) EXPECT_EQ(Address(kt, 1, 2, d, t), Address(k, 1, 2, t, d));
}

TEST(SdpaLayoutTest, OutputViewCoversTheOutputOnce) {
  const Shape s{2, 4, 3, 8};
  const View o = HeadsView(s);
  std::set<int64_t> seen;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t)
        for (int d = 0; d < s.hs; ++d) {
          const int64_t a = Address(o, b, h, t, d);
          EXPECT_EQ(a, (int64_t{b} * s.T + t) * s.C() + h * s.hs + d);
          seen.insert(a);
        }
  EXPECT_EQ(seen.size(), static_cast<size_t>(s.tokens() * s.C()));
  EXPECT_EQ(*seen.rbegin(), s.tokens() * s.C() - 1);
}

TEST(SdpaLayoutTest, StatsArePackedRowsPerHead) {
  const Shape s{2, 4, 3, 8};
  const View st = StatsView(s);
  EXPECT_EQ(st.dims, (std::array<int64_t, 4>{2, 3, 4, 1}));
  EXPECT_EQ(Address(st, 1, 2, 3, 0), (1 * 3 + 2) * 4 + 3);
}

TEST(SdpaLayoutTest, StatePartsAreAlignedDisjointAndSized) {
  const Shape s{3, 7, 3, 8};  // odd sizes: each part needs its padding
  const StateLayout l = StateLayoutOf(s);
  const size_t tokens = 21, C = 24;
  EXPECT_EQ(l.out_bytes, 0u);
  EXPECT_GE(l.stats_bytes, l.out_bytes + tokens * C * 2);
  EXPECT_GE(l.total_bytes, l.stats_bytes + size_t{3} * 3 * 7 * 4);
  for (size_t offset : {l.stats_bytes, l.total_bytes}) {
    EXPECT_EQ(offset % kStateAlignment, 0u);
  }
  EXPECT_LT(l.total_bytes, l.stats_bytes + size_t{3} * 3 * 7 * 4 + kStateAlignment);
  EXPECT_EQ(l.numel() * sizeof(float), l.total_bytes);
}

TEST(SdpaLayoutTest, Gpt2StateIsAboutAThirtiethOfTheProbabilities) {
  // GPT-2 124M at B 16, T 1024: 12 heads of 64.
  const Shape s{16, 1024, 12, 64};
  const size_t probabilities = size_t{16} * 12 * 1024 * 1024;  // fp32 elements
  const size_t state = StateLayoutOf(s).numel();
  // Per token C bf16 (the output) and NH fp32: (2 * 768 + 4 * 12) bytes,
  // against 4 NH T = 49,152 bytes of probabilities: 0.032 of them.
  EXPECT_EQ(state, (size_t{16384} * 768 * 2 + size_t{16384} * 12 * 4) / 4);
  EXPECT_LT(state * 31, probabilities);
  EXPECT_GT(state * 32, probabilities);
}

TEST(SdpaLayoutTest, UnsupportedShapesSayWhy) {
  EXPECT_EQ(UnsupportedReason(Shape{1, 8, 2, 64}), nullptr);
  EXPECT_EQ(UnsupportedReason(Shape{1, 8, 2, 128}), nullptr);
  EXPECT_NE(UnsupportedReason(Shape{1, 8, 2, 12}), nullptr);
  EXPECT_NE(UnsupportedReason(Shape{1, 8, 2, 136}), nullptr);
  EXPECT_NE(UnsupportedReason(Shape{0, 8, 2, 64}), nullptr);
}

}  // namespace
}  // namespace cohort::compute::sdpa
