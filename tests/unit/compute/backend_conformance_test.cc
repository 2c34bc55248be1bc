// Backend conformance: every op of compute::Backend, through the interface
// only (Allocate, CopyFromHost, the op, CopyToHost), against the float64
// references of reference_kernels.h, on awkward sizes: T not a multiple of
// 32, an odd head size, a vocabulary padded to Vp. Parametrized over the
// backends this build can make; a backend the build or the machine lacks
// (CUDA without a device) skips with the reason. Tolerance: fp32 within 1e-5
// relative (Frobenius) of the float64 result.

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
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

std::string KindName(const ::testing::TestParamInfo<BackendKind>& info) {
  return info.param == BackendKind::kCpu ? "Cpu" : "Cuda";
}

class BackendConformanceTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.kind = GetParam();
    options.num_threads = 1;
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
    if (!backend.ok()) {
      GTEST_SKIP() << "no " << KindName({GetParam(), 0}) << " backend here: "
                   << backend.status();
    }
    backend_ = *std::move(backend);
    ASSERT_EQ(backend_->activation_dtype(), DType::kFloat32)
        << "the bf16 bounds of a mixed-precision backend are not stated yet";
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
  std::vector<float> Download(const Buffer& buffer) {
    EXPECT_TRUE(backend_->Synchronize().ok());
    std::vector<float> host(buffer.numel());
    backend_->CopyToHost(host.data(), buffer.span());
    return host;
  }

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
  const std::vector<float> wte = RandomFloats(size_t{Vp} * C, 2), wpe = RandomFloats(size_t{T} * C, 3);
  const std::vector<float> dout = RandomFloats(size_t{N} * C, 4);
  Buffer inp_b = Upload(inp), wte_b = Upload(wte), wpe_b = Upload(wpe), out = Zeros(size_t{N} * C);
  backend_->EncoderForward(out.span(), inp_b.span(), wte_b.span(), wpe_b.span(), B, T, C);
  EXPECT_LT(RelativeError(Download(out), ref::Encoder(inp, ToDouble(wte), ToDouble(wpe), B, T, C)),
            kFp32Tolerance);
  // Backward: the gradients of sum(dout * out).
  Buffer dout_b = Upload(dout), dwte = Zeros(wte.size()), dwpe = Zeros(wpe.size());
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
  const std::vector<float> x = RandomFloats(size_t{N} * C, 5, 3.0f), w = RandomFloats(C, 6),
                           bias = RandomFloats(C, 7), dout = RandomFloats(size_t{N} * C, 8);
  Buffer x_b = Upload(x), w_b = Upload(w), bias_b = Upload(bias);
  Buffer out = Zeros(x.size()), mean = Zeros(N), rstd = Zeros(N);
  backend_->LayerNormForward(out.span(), mean.span(), rstd.span(), x_b.span(), w_b.span(),
                             bias_b.span(), N, C);
  EXPECT_LT(RelativeError(Download(out), ref::LayerNorm(ToDouble(x), ToDouble(w), ToDouble(bias),
                                                        N, C)),
            kFp32Tolerance);
  Buffer dout_b = Upload(dout), dx = Zeros(x.size()), dw = Zeros(C), db = Zeros(C);
  backend_->LayerNormBackward(dx.span(), dw.span(), db.span(), dout_b.span(), x_b.span(),
                              w_b.span(), mean.span(), rstd.span(), N, C);
  Vec dx_ref, dw_ref, db_ref;
  ref::LayerNormBackward(ToDouble(dout), ToDouble(x), ToDouble(w), N, C, &dx_ref, &dw_ref, &db_ref);
  EXPECT_LT(RelativeError(Download(dx), dx_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(dw), dw_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(db), db_ref), kFp32Tolerance);
}

TEST_P(BackendConformanceTest, Matmul) {
  const std::vector<float> x = RandomFloats(size_t{N} * C, 9), w = RandomFloats(size_t{OC} * C, 10),
                           bias = RandomFloats(OC, 11), dout = RandomFloats(size_t{N} * OC, 12);
  Buffer x_b = Upload(x), w_b = Upload(w), bias_b = Upload(bias), out = Zeros(size_t{N} * OC);
  backend_->MatmulForward(out.span(), x_b.span(), w_b.span(), bias_b.span(), N, C, OC);
  EXPECT_LT(RelativeError(Download(out),
                          ref::Matmul(ToDouble(x), ToDouble(w), ToDouble(bias), N, C, OC)),
            kFp32Tolerance);
  Buffer dout_b = Upload(dout), dx = Zeros(x.size()), dw = Zeros(w.size()), db = Zeros(OC);
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
  EXPECT_LT(RelativeError(Download(dx), dx_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(dw), dw_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(db), db_ref), kFp32Tolerance);
}

TEST_P(BackendConformanceTest, CausalAttention) {
  const std::vector<float> qkv = RandomFloats(size_t{N} * 3 * C, 13),
                           dout = RandomFloats(size_t{N} * C, 14);
  Buffer qkv_b = Upload(qkv), out = Zeros(size_t{N} * C);
  Buffer state = Zeros(backend_->AttentionStateNumel(B, T, NH));
  backend_->AttentionForward(out.span(), state.span(), qkv_b.span(), B, T, C, NH);
  EXPECT_LT(RelativeError(Download(out), ref::Attention(ToDouble(qkv), B, T, C, NH)),
            kFp32Tolerance);
  Buffer dout_b = Upload(dout), dqkv = Zeros(qkv.size());
  backend_->AttentionBackward(dqkv.span(), dout_b.span(), qkv_b.span(), state.span(), B, T, C, NH);
  EXPECT_LT(RelativeError(Download(dqkv),
                          ref::AttentionBackward(ToDouble(dout), ToDouble(qkv), B, T, C, NH)),
            kFp32Tolerance);
}

TEST_P(BackendConformanceTest, GeluAndResidual) {
  const size_t n = size_t{N} * C;
  const std::vector<float> x = RandomFloats(n, 15, 4.0f), y = RandomFloats(n, 16),
                           dout = RandomFloats(n, 17);
  Buffer x_b = Upload(x), y_b = Upload(y), dout_b = Upload(dout);
  Buffer gelu = Zeros(n), dgelu = Zeros(n), sum = Zeros(n), d1 = Zeros(n), d2 = Zeros(n);
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
  EXPECT_LT(RelativeError(Download(gelu), gelu_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(dgelu), dgelu_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(sum), sum_ref), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(d1), ToDouble(dout)), kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(d2), ToDouble(dout)), kFp32Tolerance);
}

TEST_P(BackendConformanceTest, CrossEntropyOverAPaddedVocabulary) {
  std::vector<float> logits = RandomFloats(size_t{N} * Vp, 18, 5.0f);
  // The padding holds huge values: any use of it shows.
  for (int n = 0; n < N; ++n)
    for (int i = V; i < Vp; ++i) logits[static_cast<size_t>(n) * Vp + i] = 1e4f;
  const std::vector<int32_t> targets = RandomIds(N, V, 19);
  const std::vector<float> dlosses = RandomFloats(N, 20);
  Buffer logits_b = Upload(logits), targets_b = Upload(targets), dlosses_b = Upload(dlosses);
  Buffer losses = Zeros(N), lse = Zeros(N), dlogits = Zeros(logits.size());
  backend_->CrossEntropyForward(losses.span(), lse.span(), logits_b.span(), targets_b.span(), N, V,
                                Vp);
  EXPECT_LT(RelativeError(Download(losses),
                          ref::CrossEntropy(ToDouble(logits), targets, N, V, Vp)),
            kFp32Tolerance);
  EXPECT_LT(RelativeError(Download(lse), ref::LogSumExp(ToDouble(logits), N, V, Vp)),
            kFp32Tolerance);
  backend_->CrossEntropyBackward(dlogits.span(), logits_b.span(), lse.span(), targets_b.span(),
                                 dlosses_b.span(), N, V, Vp);
  EXPECT_LT(RelativeError(Download(dlogits),
                          ref::CrossEntropyGrad(ToDouble(logits), targets, dlosses, N, V, Vp)),
            kFp32Tolerance);
}

// Every op twice on the same inputs: the same bits (the determinism the
// Backend interface promises).
TEST_P(BackendConformanceTest, EveryOpIsBitwiseReproducible) {
  const std::vector<float> x = RandomFloats(size_t{N} * C, 21), w = RandomFloats(size_t{OC} * C, 22),
                           qkv = RandomFloats(size_t{N} * 3 * C, 23);
  Buffer x_b = Upload(x), w_b = Upload(w), qkv_b = Upload(qkv);
  auto run = [&] {
    Buffer mm = Zeros(size_t{N} * OC), att = Zeros(size_t{N} * C);
    Buffer state = Zeros(backend_->AttentionStateNumel(B, T, NH));
    backend_->MatmulForward(mm.span(), x_b.span(), w_b.span(), TensorSpan{}, N, C, OC);
    backend_->AttentionForward(att.span(), state.span(), qkv_b.span(), B, T, C, NH);
    std::vector<float> out = Download(mm);
    const std::vector<float> a = Download(att);
    out.insert(out.end(), a.begin(), a.end());
    return out;
  };
  EXPECT_EQ(run(), run());
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformanceTest,
                         ::testing::Values(BackendKind::kCpu, BackendKind::kCuda), KindName);

}  // namespace
}  // namespace cohort::compute
