// The CUDA backend's GEMM builders (gemm_shapes.h), run on the CPU the way
// cuBLAS runs them: cblas_sgemm in column-major form with exactly the
// built transposes, m/n/k, leading dimensions, operands, alpha and beta,
// batch by batch at the built strides. Each result is compared with what
// backend.h documents the product to be, in row-major terms, computed in
// double. Odd sizes (75 channels, 3 heads, T 7), so that no dimension can
// stand in for another. The mutation test checks that these comparisons
// fail for a wrong transpose, leading dimension, stride, operand order or
// scalar, so they cannot pass vacuously.

#include "worker/compute/gemm_shapes.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/reference_kernels.h"

namespace cohort::compute {
namespace {

using ref::RandomFloats;

// fp32's unit roundoff.
constexpr double kUnitRoundoff = 0x1p-24;

// Elements [0, extent) that an operand stored column-major as `batch`
// (rows x cols) matrices of leading dimension `ld`, `stride` apart, spans;
// -1 when ld < rows, which BLAS refuses.
int64_t Extent(int rows, int cols, int ld, int batch, int64_t stride) {
  if (ld < std::max(rows, 1)) return -1;
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + int64_t{cols - 1} * ld + rows;
}

// The expected output of a product, element by element: its value in
// double and the sum of its terms' magnitudes (|alpha| sum |x y| + |beta c|),
// with the number of terms in each dot product.
struct Expected {
  std::vector<double> value;
  std::vector<double> magnitude;
  int inner = 0;
};

// One operand of a row-major product over `count` arrays of (rows, cols)
// stored one after another, used as stored or transposed.
struct RowMajor {
  const std::vector<float>& values;
  int rows = 0;
  int cols = 0;
  bool transposed = false;

  int op_rows() const { return transposed ? cols : rows; }
  int op_cols() const { return transposed ? rows : cols; }
  // Element (i, j) of the operand (transposed or not) of array h.
  double At(int h, int i, int j) const {
    const size_t base = static_cast<size_t>(h) * rows * cols;
    return transposed ? values[base + static_cast<size_t>(j) * cols + i]
                      : values[base + static_cast<size_t>(i) * cols + j];
  }
};

// out[h] = alpha op(x[h]) op(y[h]) + beta out[h] for h < count, row-major,
// in double: the product as backend.h and the attention comments state it.
Expected RowMajorProduct(double alpha, const RowMajor& x, const RowMajor& y, double beta,
                         const std::vector<float>& out, int count) {
  EXPECT_EQ(x.op_cols(), y.op_rows());
  const int rows = x.op_rows(), cols = y.op_cols(), inner = x.op_cols();
  Expected expected{.value = std::vector<double>(out.size()),
                    .magnitude = std::vector<double>(out.size()),
                    .inner = inner};
  for (int h = 0; h < count; ++h)
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) {
        double sum = 0.0, magnitude = 0.0;
        for (int l = 0; l < inner; ++l) {
          const double term = x.At(h, i, l) * y.At(h, l, j);
          sum += term;
          magnitude += std::abs(term);
        }
        const size_t at = (static_cast<size_t>(h) * rows + i) * cols + j;
        expected.value[at] = alpha * sum + beta * out[at];
        expected.magnitude[at] = std::abs(alpha) * magnitude + std::abs(beta * out[at]);
      }
  return expected;
}

// One builder's GEMM over random host operands, with what it must compute.
struct Case {
  std::string name;
  std::deque<std::vector<float>> buffers;  // a deque: elements never move
  GemmCall call;
  std::vector<float>* out = nullptr;
  std::vector<float> out_before;
  Expected expected;

  std::vector<float>& Add(size_t n, uint64_t seed) {
    return buffers.emplace_back(RandomFloats(n, seed));
  }
  // The elements of the buffer `p` points at (a GEMM's operands start at
  // their buffer's start); -1 for memory no buffer holds.
  int64_t SizeAt(const float* p) const {
    for (const std::vector<float>& buffer : buffers) {
      if (buffer.data() == p) return static_cast<int64_t>(buffer.size());
    }
    return -1;
  }
};

// The elements of the host buffer an operand pointer starts, -1 for none.
using SizeAt = std::function<int64_t(const float*)>;

// Runs `call` as cuBLAS would: cblas_sgemm in column-major form, every
// field as built, batch by batch. Fails without running when an operand
// would reach past its buffer (a correct call never does).
::testing::AssertionResult RunColumnMajor(const GemmCall& call, const SizeAt& size_at) {
  const GemmShape& s = call.shape;
  struct Span {
    const char* name;
    const float* data;
    int rows, cols, ld;
    int64_t stride;
  };
  // The builders keep the operands' addresses untyped (the CUDA backend
  // hands them bf16 activations too); these are fp32 host buffers.
  const auto* a = static_cast<const float*>(call.a);
  const auto* b = static_cast<const float*>(call.b);
  auto* c = static_cast<float*>(call.c);
  const Span spans[] = {
      {"A", a, s.transa ? s.k : s.m, s.transa ? s.m : s.k, s.lda, s.stride_a},
      {"B", b, s.transb ? s.n : s.k, s.transb ? s.k : s.n, s.ldb, s.stride_b},
      {"C", c, s.m, s.n, s.ldc, s.stride_c},
  };
  for (const Span& span : spans) {
    const int64_t extent = Extent(span.rows, span.cols, span.ld, s.batch, span.stride);
    if (extent < 0 || extent > size_at(span.data)) {
      return ::testing::AssertionFailure()
             << span.name << " (" << span.rows << "x" << span.cols << ", ld " << span.ld
             << ", stride " << span.stride << ", batch " << s.batch << ") spans " << extent
             << " elements of a buffer of " << size_at(span.data);
    }
  }
  for (int i = 0; i < s.batch; ++i) {
    cblas_sgemm(CblasColMajor, s.transa ? CblasTrans : CblasNoTrans,
                s.transb ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, call.alpha, a + i * s.stride_a,
                s.lda, b + i * s.stride_b, s.ldb, call.beta, c + i * s.stride_c, s.ldc);
  }
  return ::testing::AssertionSuccess();
}

// Runs `call` on the case's operands (its output reset first) and compares
// each output element with the expected one within (inner + 2) u of its
// magnitude: the worst-case error of an fp32 dot product of `inner` terms
// summed in any order, plus alpha's product and beta's sum.
::testing::AssertionResult Computes(Case& c, const GemmCall& call) {
  *c.out = c.out_before;
  ::testing::AssertionResult ran =
      RunColumnMajor(call, [&c](const float* p) { return c.SizeAt(p); });
  if (!ran) return ran;
  const double bound = (c.expected.inner + 2) * kUnitRoundoff;
  for (size_t i = 0; i < c.out->size(); ++i) {
    const double error = std::abs((*c.out)[i] - c.expected.value[i]);
    if (!(error <= bound * c.expected.magnitude[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << (*c.out)[i] << ", expected " << c.expected.value[i]
             << " within " << bound * c.expected.magnitude[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- The cases: one per GEMM the model issues ---------------------------------

// A row-major operand before it is filled: (rows, cols) arrays, one per
// head, used as stored or transposed.
struct OperandShape {
  int rows = 0;
  int cols = 0;
  bool transposed = false;
};

// Builds a GEMM over an output and two operands.
using Build = std::function<GemmCall(float* out, const float* first, const float* second)>;

// A builder's case: random operands and a random output (garbage to
// overwrite, or what is added to), and what the product must be, in
// backend.h's row-major terms: out[h] = alpha op(first[h]) op(second[h]) +
// beta out[h] for h < count.
std::unique_ptr<Case> ProductCase(const std::string& name, const OperandShape& first,
                                  const OperandShape& second, int count, double alpha, double beta,
                                  const Build& build) {
  auto c = std::make_unique<Case>();
  c->name = name;
  const RowMajor x_shape{c->Add(size_t{1} * count * first.rows * first.cols, 1), first.rows,
                         first.cols, first.transposed};
  const RowMajor y_shape{c->Add(size_t{1} * count * second.rows * second.cols, 2), second.rows,
                         second.cols, second.transposed};
  c->out = &c->Add(size_t{1} * count * x_shape.op_rows() * y_shape.op_cols(), 3);
  c->out_before = *c->out;
  c->call = build(c->out->data(), x_shape.values.data(), y_shape.values.data());
  c->expected = RowMajorProduct(alpha, x_shape, y_shape, beta, c->out_before, count);
  return c;
}

constexpr HeadBatch kHeads{.count = 2 * 3, .T = 7, .hs = 25};  // B 2, NH 3, C 75
const float kScale = 1.0f / std::sqrt(25.0f);

std::vector<std::unique_ptr<Case>> AllCases() {
  std::vector<std::unique_ptr<Case>> cases;
  // (N, C, OC): the qkv projection, the MLP's down projection, an LM head
  // over a vocabulary of 211, and a tiny one.
  const int shapes[][3] = {{14, 75, 225}, {14, 300, 75}, {14, 75, 211}, {1, 5, 3}};
  for (const auto& [N, C, OC] : shapes) {
    const std::string dims = absl::StrCat(" N", N, " C", C, " OC", OC);
    for (GemmOutput output : {GemmOutput::kWrite, GemmOutput::kAccumulate}) {
      const bool onto_bias = output == GemmOutput::kAccumulate;
      // out (N,OC) = inp (N,C) weight^T [+ out, holding the bias].
      cases.push_back(
          ProductCase(absl::StrCat("MatmulForward", dims, onto_bias ? " onto the bias" : ""),
                      {N, C}, {OC, C, true}, 1, 1.0, onto_bias ? 1.0 : 0.0,
                      [=](float* out, const float* inp, const float* weight) {
                        return MatmulForwardGemm(out, inp, weight, N, C, OC, output);
                      }));
    }
    // dinp (N,C) += dout (N,OC) weight (OC,C).
    cases.push_back(ProductCase("MatmulBackward dinp" + dims, {N, OC}, {OC, C}, 1, 1.0, 1.0,
                                [=](float* out, const float* dout, const float* weight) {
                                  return MatmulInputGradGemm(out, dout, weight, N, C, OC);
                                }));
    // dweight (OC,C) += dout^T (OC,N) inp (N,C).
    cases.push_back(ProductCase("MatmulBackward dweight" + dims, {N, OC, true}, {N, C}, 1, 1.0, 1.0,
                                [=](float* out, const float* dout, const float* inp) {
                                  return MatmulWeightGradGemm(out, dout, inp, N, C, OC);
                                }));
  }
  const HeadBatch one_head{.count = 1, .T = 7, .hs = 25};
  for (const HeadBatch& heads : {kHeads, one_head}) {
    const int T = heads.T, hs = heads.hs;
    auto attention = [&](const char* name, const OperandShape& first, const OperandShape& second,
                         double alpha, const Build& build) {
      cases.push_back(ProductCase(absl::StrCat("attention ", name, " heads ", heads.count), first,
                                  second, heads.count, alpha, 0.0, build));
    };
    // scores (T,T) = scale q (T,hs) k^T
    attention("scores", {T, hs}, {T, hs, true}, kScale,
              [=](float* out, const float* q, const float* k) {
                return AttentionScoresGemm(out, q, k, kScale, heads);
              });
    // out (T,hs) = att (T,T) v
    attention("output", {T, T}, {T, hs}, 1.0, [=](float* out, const float* att, const float* v) {
      return AttentionOutputGemm(out, att, v, heads);
    });
    // datt (T,T) = dout (T,hs) v^T
    attention("probabilities' gradient", {T, hs}, {T, hs, true}, 1.0,
              [=](float* out, const float* dout, const float* v) {
                return AttentionProbsGradGemm(out, dout, v, heads);
              });
    // dv (T,hs) = att^T dout
    attention("v's gradient", {T, T, true}, {T, hs}, 1.0,
              [=](float* out, const float* att, const float* dout) {
                return AttentionValueGradGemm(out, att, dout, heads);
              });
    // dq (T,hs) = scale dscores k
    attention("q's gradient", {T, T}, {T, hs}, kScale,
              [=](float* out, const float* ds, const float* k) {
                return AttentionQueryGradGemm(out, ds, k, kScale, heads);
              });
    // dk (T,hs) = scale dscores^T q
    attention("k's gradient", {T, T, true}, {T, hs}, kScale,
              [=](float* out, const float* ds, const float* q) {
                return AttentionKeyGradGemm(out, ds, q, kScale, heads);
              });
  }
  return cases;
}

TEST(GemmShapesTest, EveryBuilderComputesWhatItsOpDocuments) {
  for (const std::unique_ptr<Case>& c : AllCases()) {
    EXPECT_TRUE(Computes(*c, c->call)) << c->name;
  }
}

// What the CUDA backend's Gemm and BatchedGemm take for granted (and CHECK):
// the linear layers are single GEMMs; attention's batches are packed, so a
// batch is rounded to bf16 as one matrix.
TEST(GemmShapesTest, LinearGemmsAreSingleAndAttentionBatchesPacked) {
  for (const std::unique_ptr<Case>& c : AllCases()) {
    const GemmShape& s = c->call.shape;
    EXPECT_EQ(s.a_rows(), s.transa ? s.k : s.m) << c->name;
    EXPECT_EQ(s.b_cols(), s.transb ? s.k : s.n) << c->name;
    if (c->name.starts_with("Matmul")) {
      EXPECT_EQ(s.batch, 1) << c->name;
      continue;
    }
    EXPECT_EQ(s.stride_a, int64_t{s.lda} * s.a_cols()) << c->name;
    EXPECT_EQ(s.stride_b, int64_t{s.ldb} * s.b_cols()) << c->name;
    EXPECT_EQ(s.stride_c, int64_t{s.ldc} * s.n) << c->name;
  }
}

// The comparison above is what would catch a wrong builder: each of these
// slips must make it fail, for every GEMM.
TEST(GemmShapesTest, AWrongTransposeLeadingDimensionStrideOrOperandFails) {
  const std::vector<std::pair<std::string, std::function<bool(GemmCall&)>>> slips = {
      {"transa flipped", [](GemmCall& g) { return g.shape.transa = !g.shape.transa, true; }},
      {"transb flipped", [](GemmCall& g) { return g.shape.transb = !g.shape.transb, true; }},
      // A leading dimension means nothing to a matrix of one column.
      {"lda + 1", [](GemmCall& g) { return g.shape.a_cols() > 1 && ++g.shape.lda; }},
      {"ldb + 1", [](GemmCall& g) { return g.shape.b_cols() > 1 && ++g.shape.ldb; }},
      {"ldc + 1", [](GemmCall& g) { return g.shape.n > 1 && ++g.shape.ldc; }},
      {"A and B swapped", [](GemmCall& g) { return std::swap(g.a, g.b), true; }},
      {"m and n swapped", [](GemmCall& g) { return std::swap(g.shape.m, g.shape.n), true; }},
      {"alpha 1", [](GemmCall& g) { return g.alpha != 1.0f && (g.alpha = 1.0f, true); }},
      {"beta flipped", [](GemmCall& g) { return g.beta = 1.0f - g.beta, true; }},
      {"stride_a + 1", [](GemmCall& g) { return g.shape.batch > 1 && ++g.shape.stride_a; }},
      {"stride_b + 1", [](GemmCall& g) { return g.shape.batch > 1 && ++g.shape.stride_b; }},
      {"stride_c + 1", [](GemmCall& g) { return g.shape.batch > 1 && ++g.shape.stride_c; }},
  };
  int caught = 0;
  for (const std::unique_ptr<Case>& c : AllCases()) {
    for (const auto& [slip, apply] : slips) {
      GemmCall wrong = c->call;
      if (!apply(wrong)) continue;  // does not apply to this GEMM
      // m and n swapped is no slip for a square product of one operand
      // shape (the scores' T x T): skip that coincidence, nothing else.
      if (slip == "m and n swapped" && wrong.shape.m == wrong.shape.n) continue;
      EXPECT_FALSE(Computes(*c, wrong)) << c->name << " with " << slip;
      ++caught;
    }
  }
  EXPECT_GT(caught, 200);
}

// ---- Attention's products composed, against the Backend op ---------------------
// The six products, with the CUDA backend's glue written out on the host
// (head-major copies, causal softmax and its backward), must give
// backend.h's AttentionForward and AttentionBackward, computed in double.

constexpr int kB = 2, kT = 7, kNH = 3, kHs = 25, kC = kNH * kHs;

size_t HeadIndex(int b, int h, int t, int i) {
  return ((static_cast<size_t>(b) * kNH + h) * kT + t) * kHs + i;
}
// Element (b, t, part, h, i) of a (B,T,parts,NH,hs) array.
size_t MergedIndex(int parts, int part, int b, int t, int h, int i) {
  return ((static_cast<size_t>(b) * kT + t) * parts + part) * kC + h * kHs + i;
}

// (B,NH,T,hs) heads of part `part` of a (B,T,parts,NH,hs) array.
std::vector<float> SplitPart(const std::vector<float>& merged, int parts, int part) {
  std::vector<float> heads(size_t{1} * kB * kNH * kT * kHs);
  for (int b = 0; b < kB; ++b)
    for (int h = 0; h < kNH; ++h)
      for (int t = 0; t < kT; ++t)
        for (int i = 0; i < kHs; ++i)
          heads[HeadIndex(b, h, t, i)] = merged[MergedIndex(parts, part, b, t, h, i)];
  return heads;
}

// Runs a builder's call over the test's host vectors.
::testing::AssertionResult RunOnHost(const GemmCall& call,
                                     const std::vector<const std::vector<float>*>& buffers) {
  return RunColumnMajor(call, [&buffers](const float* p) -> int64_t {
    for (const std::vector<float>* buffer : buffers) {
      if (buffer->data() == p) return static_cast<int64_t>(buffer->size());
    }
    return -1;
  });
}

TEST(GemmShapesTest, AttentionsProductsComposeToTheBackendsAttention) {
  const std::vector<float> qkv = RandomFloats(size_t{3} * kB * kT * kC, 20);
  const std::vector<float> dout = RandomFloats(size_t{1} * kB * kT * kC, 21);
  const HeadBatch heads{.count = kB * kNH, .T = kT, .hs = kHs};
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHs));
  std::vector<float> q = SplitPart(qkv, 3, 0), k = SplitPart(qkv, 3, 1), v = SplitPart(qkv, 3, 2);
  std::vector<float> att(size_t{1} * heads.count * kT * kT), o(q.size());
  std::vector<float> datt(att.size()), dq(q.size()), dk(q.size()), dv(q.size());
  const std::vector<const std::vector<float>*> buffers = {&q,    &k,  &v,  &att, &o,
                                                          &datt, &dq, &dk, &dv};
  ASSERT_TRUE(
      RunOnHost(AttentionScoresGemm(att.data(), q.data(), k.data(), scale, heads), buffers));
  for (size_t row = 0; row < att.size() / kT; ++row) {  // causal softmax
    float* p = &att[row * kT];
    const int t = static_cast<int>(row % kT);
    double max = -1e300, sum = 0.0;
    for (int u = 0; u <= t; ++u) max = std::max<double>(max, p[u]);
    for (int u = 0; u <= t; ++u) sum += std::exp(p[u] - max);
    for (int u = 0; u < kT; ++u) p[u] = u <= t ? static_cast<float>(std::exp(p[u] - max) / sum) : 0;
  }
  ASSERT_TRUE(RunOnHost(AttentionOutputGemm(o.data(), att.data(), v.data(), heads), buffers));
  std::vector<float> out(dout.size());
  for (int b = 0; b < kB; ++b)
    for (int h = 0; h < kNH; ++h)
      for (int t = 0; t < kT; ++t)
        for (int i = 0; i < kHs; ++i) out[MergedIndex(1, 0, b, t, h, i)] = o[HeadIndex(b, h, t, i)];
  EXPECT_LT(ref::RelativeError(out, ref::Attention(ref::ToDouble(qkv), kB, kT, kC, kNH)), 1e-5);

  const std::vector<float> d_o = SplitPart(dout, 1, 0);
  std::vector<const std::vector<float>*> with_dout = buffers;
  with_dout.push_back(&d_o);
  ASSERT_TRUE(
      RunOnHost(AttentionProbsGradGemm(datt.data(), d_o.data(), v.data(), heads), with_dout));
  ASSERT_TRUE(
      RunOnHost(AttentionValueGradGemm(dv.data(), att.data(), d_o.data(), heads), with_dout));
  for (size_t row = 0; row < att.size() / kT; ++row) {  // the softmax's backward
    const float* p = &att[row * kT];
    float* d = &datt[row * kT];
    const int t = static_cast<int>(row % kT);
    double dot = 0.0;
    for (int u = 0; u <= t; ++u) dot += double{p[u]} * d[u];
    for (int u = 0; u < kT; ++u) d[u] = u <= t ? static_cast<float>(p[u] * (d[u] - dot)) : 0;
  }
  ASSERT_TRUE(
      RunOnHost(AttentionQueryGradGemm(dq.data(), datt.data(), k.data(), scale, heads), buffers));
  ASSERT_TRUE(
      RunOnHost(AttentionKeyGradGemm(dk.data(), datt.data(), q.data(), scale, heads), buffers));
  std::vector<float> dqkv(qkv.size());
  for (int b = 0; b < kB; ++b)
    for (int h = 0; h < kNH; ++h)
      for (int t = 0; t < kT; ++t)
        for (int i = 0; i < kHs; ++i) {
          dqkv[MergedIndex(3, 0, b, t, h, i)] = dq[HeadIndex(b, h, t, i)];
          dqkv[MergedIndex(3, 1, b, t, h, i)] = dk[HeadIndex(b, h, t, i)];
          dqkv[MergedIndex(3, 2, b, t, h, i)] = dv[HeadIndex(b, h, t, i)];
        }
  EXPECT_LT(ref::RelativeError(dqkv, ref::AttentionBackward(ref::ToDouble(dout), ref::ToDouble(qkv),
                                                            kB, kT, kC, kNH)),
            1e-5);
}

// ---- The TF32 override ----------------------------------------------------------

TEST(GemmShapesTest, Tf32IsRefusedWhereNvidiaTf32OverrideWouldTurnItIntoFp32) {
  EXPECT_TRUE(CheckTf32Override(Precision::kTf32, nullptr).ok());
  EXPECT_TRUE(CheckTf32Override(Precision::kTf32, "1").ok());
  for (const char* value : {"0", "", "false"}) {
    const absl::Status status = CheckTf32Override(Precision::kTf32, value);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << value;
    EXPECT_NE(status.message().find("NVIDIA_TF32_OVERRIDE"), std::string_view::npos) << status;
  }
  // fp32 is pedantic and bf16 operands are not fp32: the variable changes
  // neither.
  EXPECT_TRUE(CheckTf32Override(Precision::kFp32, "0").ok());
  EXPECT_TRUE(CheckTf32Override(Precision::kBf16, "0").ok());
}

}  // namespace
}  // namespace cohort::compute
