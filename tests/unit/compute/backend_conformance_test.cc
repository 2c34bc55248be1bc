// Backend conformance: every op of compute::Backend, through the interface
// only (Allocate, CopyFromHost, the op, CopyToHost), against the float64
// references of reference_kernels.h, on awkward sizes: T not a multiple of
// 32, an odd head size, a vocabulary padded to Vp. Parametrized over the
// backends and precisions this build can make; a backend the build or the
// machine lacks (CUDA without a device) skips with the reason, or fails
// under COHORT_GPU_REQUIRED=1 (tests/testing/gpu_required.h).
//
// Tolerances, relative (Frobenius) to the float64 result:
// - fp32: 1e-5 for every op.
// - tf32 (the CUDA backend's matmuls and attention products on tensor
//   cores): TF32 keeps 10 explicit mantissa bits, so each operand of a
//   product is rounded by up to 2^-11 (4.9e-4) relative and a product of two
//   by up to about 1e-3; over the random-sign sums here the rounding errors
//   partly cancel, for an expected Frobenius error near 5e-4. The bound is
//   2e-3: four times that, and still far below the O(1) error of a wrong
//   transpose or a missing term. The other ops stay fp32 (1e-5).
// - bf16 (the same products with each operand rounded to bf16, 7 explicit
//   mantissa bits, unit roundoff 2^-8 = 3.9e-3, fp32 accumulation): eight
//   times tf32's rounding, an expected Frobenius error near 2.5e-3 (the
//   tf32 simulation's 0.6 u). The bound is 1e-2, four times that; attention's
//   backward compounds three rounded products and stays inside it in
//   expectation. The other ops stay fp32.
// - Activations stored in bf16 (the CUDA backend in precision bf16;
//   backend.h, "Activation storage"): the inputs are rounded to bf16 on the
//   host and the references computed from those rounded values, so what
//   remains is the output's own rounding, at most 2^-8 relative per element
//   (3.9e-3; the bound is 4e-3), over fp32 arithmetic: outputs stored in
//   bf16 take that bound, those stored in fp32 (statistics, parameter
//   gradients, losses) keep theirs; products stored in bf16 take the
//   product bound plus it (1.4e-2).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/gpu_required.h"
#include "tests/unit/compute/activation_io.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/backend_factory.h"

namespace cohort::compute {
namespace {

using ref::RandomFloats;
using ref::RelativeError;
using ref::ToDouble;
using ref::Vec;

// Awkward sizes: T = 37, head size 75 / 3 = 25, V = 101 padded to 112.
constexpr int B = 2, T = 37, C = 75, NH = 3, V = 101, Vp = 112, OC = 83;
constexpr int N = B * T;
constexpr double kFp32Tolerance = 1e-5;
constexpr double kTf32Tolerance = 2e-3;
constexpr double kBf16Tolerance = 1e-2;
constexpr double kBf16StorageTolerance = 4e-3;

struct BackendCase {
  BackendKind kind;
  Precision precision;
};

std::string CaseName(const ::testing::TestParamInfo<BackendCase>& info) {
  if (info.param.kind == BackendKind::kCpu) return "Cpu";
  return std::string("Cuda") + (info.param.precision == Precision::kTf32   ? "Tf32"
                                : info.param.precision == Precision::kBf16 ? "Bf16"
                                                                           : "Fp32");
}

class BackendConformanceTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.kind = GetParam().kind;
    options.precision = GetParam().precision;
    options.num_threads = 1;
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
    if (!backend.ok() && GetParam().kind == BackendKind::kCuda) {
      COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no " + CaseName({GetParam(), 0}) +
                                      " backend here: " + backend.status().ToString());
    }
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }

  bool Bf16Activations() const { return backend_->activation_dtype() == DType::kBFloat16; }

  // The bound for ops whose work is matrix products (Matmul, attention).
  double ProductTolerance() const {
    switch (GetParam().precision) {
      case Precision::kTf32:
        return kTf32Tolerance;
      case Precision::kBf16:
        return kBf16Tolerance;
      default:
        return kFp32Tolerance;
    }
  }

  // The bound for an op's output stored as an activation: fp32's, or the
  // rounding of the bf16 store on top of it.
  double StoredTolerance(double fp32_bound) const {
    return Bf16Activations() ? fp32_bound + kBf16StorageTolerance : fp32_bound;
  }

  // `values` as activations hold them: rounded to bf16 where the backend
  // stores them so (the references then see what the backend sees).
  std::vector<float> AsStored(std::vector<float> values) const {
    return activation_io::AsStored(backend_->activation_dtype(), std::move(values));
  }

  // Backend memory of the activation dtype holding `host` (rounded in bf16:
  // pass AsStored values to keep references exact).
  Buffer UploadActivation(const std::vector<float>& host) {
    return activation_io::UploadAs(*backend_, backend_->activation_dtype(), host);
  }
  Buffer ZeroActivations(size_t numel) {
    absl::StatusOr<Buffer> buffer = backend_->Allocate(backend_->activation_dtype(), numel);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return *std::move(buffer);
  }

  // Backend memory holding `host`.
  Buffer Upload(const std::vector<float>& host) {
    absl::StatusOr<Buffer> buffer = backend_->Allocate(DType::kFloat32, host.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    backend_->CopyFromHost(buffer->span(), host.data());
    return *std::move(buffer);
  }
  Buffer Upload(const std::vector<int32_t>& host) {
    absl::StatusOr<Buffer> buffer = backend_->Allocate(DType::kInt32, host.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    backend_->CopyFromHost(buffer->span(), host.data());
    return *std::move(buffer);
  }
  Buffer Zeros(size_t numel) {
    absl::StatusOr<Buffer> buffer = backend_->Allocate(DType::kFloat32, numel);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return *std::move(buffer);
  }
  // fp32 or bf16 memory, widened to fp32 (exact).
  std::vector<float> Download(TensorSpan span) {
    EXPECT_TRUE(backend_->Synchronize().ok());
    return activation_io::DownloadWidened(*backend_, span);
  }
  std::vector<float> Download(const Buffer& buffer) { return Download(buffer.span()); }

  std::unique_ptr<Backend> backend_;
};

std::vector<int32_t> RandomIds(size_t n, int below, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, below - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

TEST_P(BackendConformanceTest, Encoder) {
  const std::vector<int32_t> inp = RandomIds(N, V, 1);
  const std::vector<float> wte = RandomFloats(size_t{Vp} * C, 2),
                           wpe = RandomFloats(size_t{T} * C, 3);
  const std::vector<float> dout = AsStored(RandomFloats(size_t{N} * C, 4));
  Buffer inp_b = Upload(inp), wte_b = Upload(wte), wpe_b = Upload(wpe),
         out = ZeroActivations(size_t{N} * C);
  backend_->EncoderForward(out.span(), inp_b.span(), wte_b.span(), wpe_b.span(), B, T, C);
  EXPECT_LT(RelativeError(Download(out), ref::Encoder(inp, ToDouble(wte), ToDouble(wpe), B, T, C)),
            StoredTolerance(kFp32Tolerance));
  // Backward: the gradients of sum(dout * out).
  Buffer dout_b = UploadActivation(dout), dwte = Zeros(wte.size()), dwpe = Zeros(wpe.size());
  backend_->EncoderBackward(dwte.span(), dwpe.span(), dout_b.span(), inp_b.span(), B, T, C);
  Vec dwte_ref(wte.size(), 0.0), dwpe_ref(wpe.size(), 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      dwte_ref[static_cast<size_t>(inp[n]) * C + c] += dout[static_cast<size_t>(n) * C + c];
      dwpe_ref[static_cast<size_t>(n % T) * C + c] += dout[static_cast<size_t>(n) * C + c];
    }
  EXPECT_LT(RelativeError(Download(dwte), dwte_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(dwpe), dwpe_ref), kFp32Tolerance);
}

TEST_P(BackendConformanceTest, LayerNorm) {
  const std::vector<float> x = AsStored(RandomFloats(size_t{N} * C, 5, 3.0f)),
                           w = RandomFloats(C, 6), bias = RandomFloats(C, 7),
                           dout = AsStored(RandomFloats(size_t{N} * C, 8));
  Buffer x_b = UploadActivation(x), w_b = Upload(w), bias_b = Upload(bias);
  Buffer out = ZeroActivations(x.size()), mean = Zeros(N), rstd = Zeros(N);
  backend_->LayerNormForward(out.span(), mean.span(), rstd.span(), x_b.span(), w_b.span(),
                             bias_b.span(), N, C);
  EXPECT_LT(
      RelativeError(Download(out), ref::LayerNorm(ToDouble(x), ToDouble(w), ToDouble(bias), N, C)),
      StoredTolerance(kFp32Tolerance));
  Buffer dout_b = UploadActivation(dout), dx = ZeroActivations(x.size()), dw = Zeros(C),
         db = Zeros(C);
  backend_->LayerNormBackward(dx.span(), dw.span(), db.span(), dout_b.span(), x_b.span(),
                              w_b.span(), mean.span(), rstd.span(), N, C);
  Vec dx_ref, dw_ref, db_ref;
  ref::LayerNormBackward(ToDouble(dout), ToDouble(x), ToDouble(w), N, C, &dx_ref, &dw_ref, &db_ref);
  EXPECT_LT(RelativeError(Download(dx), dx_ref), StoredTolerance(kFp32Tolerance));
  EXPECT_LT(RelativeError(Download(dw), dw_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(db), db_ref), kFp32Tolerance);
}

TEST_P(BackendConformanceTest, Matmul) {
  const std::vector<float> x = AsStored(RandomFloats(size_t{N} * C, 9)),
                           w = RandomFloats(size_t{OC} * C, 10), bias = RandomFloats(OC, 11),
                           dout = AsStored(RandomFloats(size_t{N} * OC, 12));
  Buffer x_b = UploadActivation(x), w_b = Upload(w), bias_b = Upload(bias),
         out = ZeroActivations(size_t{N} * OC);
  backend_->MatmulForward(out.span(), x_b.span(), w_b.span(), bias_b.span(), N, C, OC);
  EXPECT_LT(
      RelativeError(Download(out), ref::Matmul(ToDouble(x), ToDouble(w), ToDouble(bias), N, C, OC)),
      StoredTolerance(ProductTolerance()));
  Buffer dout_b = UploadActivation(dout), dx = ZeroActivations(x.size()), dw = Zeros(w.size()),
         db = Zeros(OC);
  backend_->MatmulBackward(dx.span(), dw.span(), db.span(), dout_b.span(), x_b.span(), w_b.span(),
                           N, C, OC);
  Vec dx_ref(x.size(), 0.0), dw_ref(w.size(), 0.0), db_ref(OC, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double d = dout[static_cast<size_t>(n) * OC + o];
      db_ref[o] += d;
      for (int c = 0; c < C; ++c) {
        dx_ref[static_cast<size_t>(n) * C + c] += d * w[static_cast<size_t>(o) * C + c];
        dw_ref[static_cast<size_t>(o) * C + c] += d * x[static_cast<size_t>(n) * C + c];
      }
    }
  EXPECT_LT(RelativeError(Download(dx), dx_ref), StoredTolerance(ProductTolerance()));
  EXPECT_LT(RelativeError(Download(dw), dw_ref), ProductTolerance());
  EXPECT_LT(RelativeError(Download(db), db_ref), kFp32Tolerance);  // a column sum, not a product
}

// The model hands the backend packed views into its activation arena, some
// only 8-byte aligned (a GPU backend's GEMMs must not assume more): the
// same products on views one and two floats into their buffers.
TEST_P(BackendConformanceTest, MatmulOnUnalignedViews) {
  const std::vector<float> x = AsStored(RandomFloats(size_t{N} * C, 41)),
                           w = RandomFloats(size_t{OC} * C, 42), bias = RandomFloats(OC, 43),
                           dout = AsStored(RandomFloats(size_t{N} * OC, 44));
  // `host` placed `offset` elements into a buffer of its own (activations
  // in the activation dtype: bf16 views 2 or 4 bytes in).
  std::vector<Buffer> keep;
  auto place = [&](const std::vector<float>& host, size_t offset, bool activation) {
    std::vector<float> padded(offset, 0.0f);
    padded.insert(padded.end(), host.begin(), host.end());
    keep.push_back(activation ? UploadActivation(padded) : Upload(padded));
    return keep.back().Slice(offset, host.size());
  };
  auto view = [&](const std::vector<float>& host, size_t offset) {
    return place(host, offset, /*activation=*/false);
  };
  auto activation_view = [&](const std::vector<float>& host, size_t offset) {
    return place(host, offset, /*activation=*/true);
  };
  const std::vector<float> zeros_out(size_t{N} * OC, 0.0f), zeros_x(x.size(), 0.0f),
      zeros_w(w.size(), 0.0f);
  const TensorSpan x_v = activation_view(x, 1), w_v = view(w, 2), bias_v = view(bias, 1),
                   out_v = activation_view(zeros_out, 2), dout_v = activation_view(dout, 1),
                   dx_v = activation_view(zeros_x, 2), dw_v = view(zeros_w, 1);
  backend_->MatmulForward(out_v, x_v, w_v, bias_v, N, C, OC);
  backend_->MatmulBackward(dx_v, dw_v, TensorSpan{}, dout_v, x_v, w_v, N, C, OC);
  auto download = [&](TensorSpan span) { return Download(span); };
  EXPECT_LT(RelativeError(download(out_v),
                          ref::Matmul(ToDouble(x), ToDouble(w), ToDouble(bias), N, C, OC)),
            StoredTolerance(ProductTolerance()));
  Vec dx_ref(x.size(), 0.0), dw_ref(w.size(), 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double d = dout[static_cast<size_t>(n) * OC + o];
      for (int c = 0; c < C; ++c) {
        dx_ref[static_cast<size_t>(n) * C + c] += d * w[static_cast<size_t>(o) * C + c];
        dw_ref[static_cast<size_t>(o) * C + c] += d * x[static_cast<size_t>(n) * C + c];
      }
    }
  EXPECT_LT(RelativeError(download(dx_v), dx_ref), StoredTolerance(ProductTolerance()));
  EXPECT_LT(RelativeError(download(dw_v), dw_ref), ProductTolerance());
}

TEST_P(BackendConformanceTest, CausalAttention) {
  const std::vector<float> qkv = AsStored(RandomFloats(size_t{N} * 3 * C, 13)),
                           dout = AsStored(RandomFloats(size_t{N} * C, 14));
  Buffer qkv_b = UploadActivation(qkv), out = ZeroActivations(size_t{N} * C);
  Buffer state = Zeros(backend_->AttentionStateNumel(B, T, C, NH));
  backend_->AttentionForward(out.span(), state.span(), qkv_b.span(), B, T, C, NH);
  EXPECT_LT(RelativeError(Download(out), ref::Attention(ToDouble(qkv), B, T, C, NH)),
            StoredTolerance(ProductTolerance()));
  Buffer dout_b = UploadActivation(dout), dqkv = ZeroActivations(qkv.size());
  backend_->AttentionBackward(dqkv.span(), dout_b.span(), qkv_b.span(), state.span(), B, T, C, NH);
  EXPECT_LT(RelativeError(Download(dqkv),
                          ref::AttentionBackward(ToDouble(dout), ToDouble(qkv), B, T, C, NH)),
            StoredTolerance(ProductTolerance()));
}

TEST_P(BackendConformanceTest, GeluAndResidual) {
  const size_t n = size_t{N} * C;
  const std::vector<float> x = AsStored(RandomFloats(n, 15, 4.0f)),
                           y = AsStored(RandomFloats(n, 16)), dout = AsStored(RandomFloats(n, 17));
  Buffer x_b = UploadActivation(x), y_b = UploadActivation(y), dout_b = UploadActivation(dout);
  Buffer gelu = ZeroActivations(n), dgelu = ZeroActivations(n), sum = ZeroActivations(n),
         d1 = ZeroActivations(n), d2 = ZeroActivations(n);
  backend_->GeluForward(gelu.span(), x_b.span(), n);
  backend_->GeluBackward(dgelu.span(), x_b.span(), dout_b.span(), n);
  backend_->ResidualForward(sum.span(), x_b.span(), y_b.span(), n);
  backend_->ResidualBackward(d1.span(), d2.span(), dout_b.span(), n);
  Vec gelu_ref(n), dgelu_ref(n), sum_ref(n);
  for (size_t i = 0; i < n; ++i) {
    gelu_ref[i] = ref::Gelu(x[i]);
    dgelu_ref[i] = ref::GeluGrad(x[i]) * dout[i];
    sum_ref[i] = static_cast<double>(x[i]) + y[i];
  }
  const double bound = StoredTolerance(kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(gelu), gelu_ref), bound);
  EXPECT_LT(RelativeError(Download(dgelu), dgelu_ref), bound);
  EXPECT_LT(RelativeError(Download(sum), sum_ref), bound);
  // dout added to zeros: exact in either storage.
  EXPECT_EQ(Download(d1), dout);
  EXPECT_EQ(Download(d2), dout);
}

TEST_P(BackendConformanceTest, CrossEntropyOverAPaddedVocabulary) {
  std::vector<float> logits = RandomFloats(size_t{N} * Vp, 18, 5.0f);
  // The padding holds huge values: any use of it shows.
  for (int n = 0; n < N; ++n)
    for (int i = V; i < Vp; ++i) logits[static_cast<size_t>(n) * Vp + i] = 1e4f;
  logits = AsStored(std::move(logits));
  const std::vector<int32_t> targets = RandomIds(N, V, 19);
  const std::vector<float> dlosses = RandomFloats(N, 20);
  Buffer logits_b = UploadActivation(logits), targets_b = Upload(targets),
         dlosses_b = Upload(dlosses);
  Buffer losses = Zeros(N), lse = Zeros(N), dlogits = ZeroActivations(logits.size());
  backend_->CrossEntropyForward(losses.span(), lse.span(), logits_b.span(), targets_b.span(), N, V,
                                Vp);
  EXPECT_LT(RelativeError(Download(losses), ref::CrossEntropy(ToDouble(logits), targets, N, V, Vp)),
            kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(lse), ref::LogSumExp(ToDouble(logits), N, V, Vp)),
            kFp32Tolerance);
  backend_->CrossEntropyBackward(dlogits.span(), logits_b.span(), lse.span(), targets_b.span(),
                                 dlosses_b.span(), N, V, Vp);
  EXPECT_LT(RelativeError(Download(dlogits),
                          ref::CrossEntropyGrad(ToDouble(logits), targets, dlosses, N, V, Vp)),
            StoredTolerance(kFp32Tolerance));
}

// The vocab-parallel ops over two shards that split the padded vocabulary
// unevenly (the second shard ends in the padding): the sum of the encoder
// shards is EncoderForward's result bitwise (backend.h), the three-step
// cross-entropy matches the float64 loss, and the shard gradients side by
// side are the unsharded gradient.
TEST_P(BackendConformanceTest, VocabShards) {
  constexpr int kSplit = 60;  // shard 0: ids [0, 60); shard 1: [60, 112), ids >= 101 padding
  constexpr int kWidths[2] = {kSplit, Vp - kSplit};
  constexpr int kStarts[2] = {0, kSplit};
  auto rows_of = [&](int s) {  // the shard's first and last-plus-one elements of a (Vp,C) table
    return std::pair{static_cast<size_t>(kStarts[s]) * C,
                     static_cast<size_t>(kStarts[s] + kWidths[s]) * C};
  };
  const std::vector<int32_t> inp = RandomIds(N, V, 31);
  const std::vector<float> wte = RandomFloats(size_t{Vp} * C, 32),
                           wpe = RandomFloats(size_t{T} * C, 33);
  const std::vector<float> dout = AsStored(RandomFloats(size_t{N} * C, 34));
  Buffer inp_b = Upload(inp), wpe_b = Upload(wpe), dout_b = UploadActivation(dout);
  Buffer whole = ZeroActivations(size_t{N} * C), wte_b = Upload(wte);
  backend_->EncoderForward(whole.span(), inp_b.span(), wte_b.span(), wpe_b.span(), B, T, C);
  std::vector<float> summed(size_t{N} * C, -0.0f);
  Vec dwte_ref(wte.size(), 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      dwte_ref[static_cast<size_t>(inp[n]) * C + c] += dout[static_cast<size_t>(n) * C + c];
  for (int s = 0; s < 2; ++s) {
    const auto [first, last] = rows_of(s);
    const std::vector<float> rows(wte.begin() + first, wte.begin() + last);
    Buffer rows_b = Upload(rows), out = ZeroActivations(size_t{N} * C), drows = Zeros(rows.size());
    // Shard 0 adds the positions, as a tensor rank 0 does.
    backend_->EncoderForwardShard(out.span(), inp_b.span(), rows_b.span(),
                                  s == 0 ? wpe_b.span() : TensorSpan{}, kStarts[s], kWidths[s], B,
                                  T, C);
    const std::vector<float> part = Download(out);
    for (size_t i = 0; i < summed.size(); ++i) summed[i] += part[i];
    backend_->EncoderBackwardShard(drows.span(), TensorSpan{}, dout_b.span(), inp_b.span(),
                                   kStarts[s], kWidths[s], B, T, C);
    const Vec expected(dwte_ref.begin() + first, dwte_ref.begin() + last);
    EXPECT_LT(RelativeError(Download(drows), expected), kFp32Tolerance) << "shard " << s;
  }
  if (Bf16Activations()) {
    // Each shard rounds its own part: where the token's row and the
    // positions lie in different shards, round(wte) + round(wpe) is not
    // round(wte + wpe), so the sum matches within the storage's rounding,
    // not bitwise.
    Vec whole_ref(summed.size());
    const std::vector<float> whole_out = Download(whole);
    for (size_t i = 0; i < summed.size(); ++i) whole_ref[i] = whole_out[i];
    EXPECT_LT(RelativeError(summed, whole_ref), 2 * kBf16StorageTolerance);
  } else {
    EXPECT_EQ(summed, Download(whole)) << "the shards' sum is not EncoderForward's result";
  }

  // Cross-entropy over the same split of the logit columns.
  const std::vector<float> logits = AsStored(RandomFloats(size_t{N} * Vp, 35, 5.0f));
  const std::vector<int32_t> targets = RandomIds(N, V, 36);
  const std::vector<float> dlosses = RandomFloats(N, 37);
  Buffer targets_b = Upload(targets), dlosses_b = Upload(dlosses);
  std::vector<float> row_max(N, -HUGE_VALF), sums(2 * size_t{N}, 0.0f);
  std::vector<Buffer> shard_logits;
  for (int s = 0; s < 2; ++s) {
    std::vector<float> columns(size_t{N} * kWidths[s]);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < kWidths[s]; ++j)
        columns[static_cast<size_t>(n) * kWidths[s] + j] =
            logits[static_cast<size_t>(n) * Vp + kStarts[s] + j];
    shard_logits.push_back(UploadActivation(columns));
    Buffer m = Zeros(N);
    backend_->CrossEntropyShardMax(m.span(), shard_logits[s].span(), N, V, kWidths[s], kStarts[s]);
    const std::vector<float> part = Download(m);
    for (int n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], part[n]);  // the group's max
  }
  Buffer row_max_b = Upload(row_max);
  for (int s = 0; s < 2; ++s) {
    Buffer part_b = Zeros(2 * size_t{N});
    backend_->CrossEntropyShardSums(part_b.span(), shard_logits[s].span(), row_max_b.span(),
                                    targets_b.span(), N, V, kWidths[s], kStarts[s]);
    const std::vector<float> part = Download(part_b);
    for (size_t i = 0; i < sums.size(); ++i) sums[i] += part[i];  // the group's sum
  }
  Buffer sums_b = Upload(sums), losses = Zeros(N), lse = Zeros(N);
  backend_->CrossEntropyShardFinish(losses.span(), lse.span(), row_max_b.span(), sums_b.span(), N);
  EXPECT_LT(RelativeError(Download(losses), ref::CrossEntropy(ToDouble(logits), targets, N, V, Vp)),
            kFp32Tolerance);
  const Vec dlogits_ref = ref::CrossEntropyGrad(ToDouble(logits), targets, dlosses, N, V, Vp);
  for (int s = 0; s < 2; ++s) {
    Buffer dlogits = ZeroActivations(size_t{N} * kWidths[s]);
    backend_->CrossEntropyShardBackward(dlogits.span(), shard_logits[s].span(), lse.span(),
                                        targets_b.span(), dlosses_b.span(), N, V, kWidths[s],
                                        kStarts[s]);
    Vec expected(size_t{N} * kWidths[s]);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < kWidths[s]; ++j)
        expected[static_cast<size_t>(n) * kWidths[s] + j] =
            dlogits_ref[static_cast<size_t>(n) * Vp + kStarts[s] + j];
    EXPECT_LT(RelativeError(Download(dlogits), expected), StoredTolerance(kFp32Tolerance))
        << "shard " << s;
  }
}

// A shard that holds only padding columns: its max is -infinity and its
// sums and gradient are zero.
TEST_P(BackendConformanceTest, AllPaddingShard) {
  constexpr int kWidth = Vp - V;  // ids [V, Vp)
  const std::vector<float> logits = RandomFloats(size_t{N} * kWidth, 38);
  const std::vector<int32_t> targets = RandomIds(N, V, 39);
  Buffer logits_b = UploadActivation(logits), targets_b = Upload(targets);
  Buffer m = Zeros(N), sums = Zeros(2 * size_t{N}), dlogits = ZeroActivations(logits.size());
  backend_->CrossEntropyShardMax(m.span(), logits_b.span(), N, V, kWidth, V);
  for (float x : Download(m)) EXPECT_EQ(x, -HUGE_VALF);
  Buffer zero_max = Zeros(N), lse = Upload(RandomFloats(N, 40)),
         dlosses = Upload(RandomFloats(N, 41));
  backend_->CrossEntropyShardSums(sums.span(), logits_b.span(), zero_max.span(), targets_b.span(),
                                  N, V, kWidth, V);
  for (float x : Download(sums)) EXPECT_EQ(x, 0.0f);
  backend_->CrossEntropyShardBackward(dlogits.span(), logits_b.span(), lse.span(), targets_b.span(),
                                      dlosses.span(), N, V, kWidth, V);
  for (float x : Download(dlogits)) EXPECT_EQ(x, 0.0f);
}

// Every op twice on the same inputs: the same bits (the determinism the
// Backend interface promises), the backward ops included, whose sums over
// rows and repeated tokens are where a GPU backend could lose it.
TEST_P(BackendConformanceTest, EveryOpIsBitwiseReproducible) {
  const std::vector<float> x = RandomFloats(size_t{N} * C, 21),
                           w = RandomFloats(size_t{OC} * C, 22),
                           qkv = RandomFloats(size_t{N} * 3 * C, 23),
                           dmm = RandomFloats(size_t{N} * OC, 24),
                           datt = RandomFloats(size_t{N} * C, 25), lnw = RandomFloats(C, 26),
                           wte = RandomFloats(size_t{Vp} * C, 27),
                           wpe = RandomFloats(size_t{T} * C, 28),
                           logits = RandomFloats(size_t{N} * Vp, 29, 5.0f),
                           dlosses = RandomFloats(N, 30);
  // Few distinct tokens, so that many positions add into the same wte row.
  const std::vector<int32_t> ids = RandomIds(N, 7, 31), targets = RandomIds(N, V, 32);
  Buffer x_b = UploadActivation(x), w_b = Upload(w), qkv_b = UploadActivation(qkv),
         dmm_b = UploadActivation(dmm), datt_b = UploadActivation(datt), lnw_b = Upload(lnw),
         wte_b = Upload(wte), wpe_b = Upload(wpe), logits_b = UploadActivation(logits),
         dlosses_b = Upload(dlosses), ids_b = Upload(ids), targets_b = Upload(targets);
  auto run = [&] {
    std::vector<Buffer> outputs;
    auto out = [&](size_t numel) -> TensorSpan {
      outputs.push_back(Zeros(numel));
      return outputs.back().span();
    };
    auto act = [&](size_t numel) -> TensorSpan {
      outputs.push_back(ZeroActivations(numel));
      return outputs.back().span();
    };
    const TensorSpan mm = act(size_t{N} * OC), dx = act(x.size()), dw = out(w.size()), db = out(OC);
    backend_->MatmulForward(mm, x_b.span(), w_b.span(), TensorSpan{}, N, C, OC);
    backend_->MatmulBackward(dx, dw, db, dmm_b.span(), x_b.span(), w_b.span(), N, C, OC);
    const TensorSpan att = act(size_t{N} * C),
                     state = out(backend_->AttentionStateNumel(B, T, C, NH)),
                     dqkv = act(qkv.size());
    backend_->AttentionForward(att, state, qkv_b.span(), B, T, C, NH);
    backend_->AttentionBackward(dqkv, datt_b.span(), qkv_b.span(), state, B, T, C, NH);
    const TensorSpan ln = act(x.size()), mean = out(N), rstd = out(N), dln = act(x.size()),
                     dlnw = out(C), dlnb = out(C);
    backend_->LayerNormForward(ln, mean, rstd, x_b.span(), lnw_b.span(), lnw_b.span(), N, C);
    backend_->LayerNormBackward(dln, dlnw, dlnb, datt_b.span(), x_b.span(), lnw_b.span(), mean,
                                rstd, N, C);
    const TensorSpan dwte = out(wte.size()), dwpe = out(wpe.size());
    backend_->EncoderBackward(dwte, dwpe, datt_b.span(), ids_b.span(), B, T, C);
    const TensorSpan losses = out(N), lse = out(N), dlogits = act(logits.size());
    backend_->CrossEntropyForward(losses, lse, logits_b.span(), targets_b.span(), N, V, Vp);
    backend_->CrossEntropyBackward(dlogits, logits_b.span(), lse, targets_b.span(),
                                   dlosses_b.span(), N, V, Vp);
    std::vector<float> all;
    for (const Buffer& buffer : outputs) {
      const std::vector<float> host = Download(buffer);
      all.insert(all.end(), host.begin(), host.end());
    }
    return all;
  };
  const std::vector<float> first = run();
  const std::vector<float> second = run();
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0)
      << "two runs of the same ops differ";
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformanceTest,
                         ::testing::Values(BackendCase{BackendKind::kCpu, Precision::kFp32},
                                           BackendCase{BackendKind::kCuda, Precision::kFp32},
                                           BackendCase{BackendKind::kCuda, Precision::kTf32},
                                           BackendCase{BackendKind::kCuda, Precision::kBf16}),
                         CaseName);

}  // namespace
}  // namespace cohort::compute
