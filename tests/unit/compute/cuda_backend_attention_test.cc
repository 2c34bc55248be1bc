// The CUDA backend's attention through cuDNN's fused flash attention
// (cuda_backend_attention.cc), against the CPU backend: forward and
// backward on a small shape and on GPT-2's (B 2, T 1024, 12 heads of 64),
// run-to-run bitwise equality of both, the state's size, and the fallback
// to the kernels. Needs a GPU and cuDNN on it: without either the tests
// skip naming the reason (fail so under COHORT_GPU_REQUIRED=1,
// tests/testing/gpu_required.h), since a device check whose attention never
// reached cuDNN must not pass.
//
// Tolerance: the CPU reference runs in fp32 on the bf16-rounded q, k, v and
// dout (so the inputs' rounding, which the GPU cannot avoid, is not
// counted). What remains is cuDNN's arithmetic: the probabilities rounded
// to bf16 before P V (relative 2^-9 each), the output rounded to bf16, and
// dS rounded to bf16 before its two products; fp32 accumulation throughout.
// Each result's largest error is held to 2% of its largest magnitude
// (kRelativeTolerance): several times what those roundings give over sums
// of up to 1024 terms of random sign, and far below what a wrong view, a
// missing scale or mask, or a transposed operand gives (errors of the
// order of the values themselves).
//
// The activations (qkv, out, dout, dqkv) are bf16 where cuDNN runs
// (backend.h, "Activation storage"): uploaded as bf16 bits and widened on
// the way back. The += contract is checked bitwise: dqkv from a nonzero
// start is the start plus the gradient from a zero start, added in fp32
// and rounded once.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/gpu_required.h"
#include "tests/unit/compute/activation_io.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/attention_report.h"
#include "worker/compute/backend_factory.h"
#include "worker/compute/bf16_math.h"
#include "worker/compute/cpu_backend.h"
#include "worker/compute/sdpa_layout.h"

namespace cohort::compute {
namespace {

constexpr double kRelativeTolerance = 2e-2;

struct AttentionShape {
  int B, T, C, NH;
};

PassShape PassFor(const AttentionShape& s) {
  return PassShape{.max_batch = s.B,
                   .max_seq = s.T,
                   .attention_width = s.C,
                   .heads = s.NH,
                   .max_bias_columns = 4 * s.C,
                   .width = s.C};
}

std::vector<float> RoundedToBf16(std::vector<float> values) {
  for (float& v : values) v = kernel_math::FloatOfBf16(kernel_math::Bf16Bits(v));
  return values;
}

// max |a - b| / max |b|.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

std::vector<float> Part(const std::vector<float>& qkv, const AttentionShape& s, int part) {
  std::vector<float> out;
  for (size_t row = 0; row < static_cast<size_t>(s.B) * s.T; ++row) {
    const float* begin = qkv.data() + row * 3 * s.C + part * s.C;
    out.insert(out.end(), begin, begin + s.C);
  }
  return out;
}

struct Results {
  std::vector<float> out, dqkv, state;
};

// A backend of `precision` and `mode` on device 0, or the reason there is none.
absl::StatusOr<std::unique_ptr<Backend>> MakeCuda(Precision precision, FusedAttention mode) {
  return CreateBackend(
      BackendOptions{.kind = BackendKind::kCuda, .precision = precision, .fused_attention = mode});
}

// Forward then backward on `backend` (scratch reserved for `s` first);
// dqkv starts at `dqkv0` (the backward accumulates).
Results RunAttention(Backend& backend, const AttentionShape& s, const std::vector<float>& qkv,
                     const std::vector<float>& dout, const std::vector<float>& dqkv0) {
  Results r;
  EXPECT_TRUE(backend.ReserveScratch(PassFor(s)).ok());
  const size_t btc = static_cast<size_t>(s.B) * s.T * s.C;
  const size_t state_numel = backend.AttentionStateNumel(s.B, s.T, s.C, s.NH);
  const DType act = backend.activation_dtype();
  auto buffer = [&](DType dtype, size_t n) {
    absl::StatusOr<Buffer> b = backend.Allocate(dtype, n);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : Buffer();
  };
  // Activations move as their dtype's bits (bf16 narrowed from host floats
  // that are bf16 values already), and come back widened.
  Buffer d_qkv = activation_io::UploadAs(backend, act, qkv), d_out = buffer(act, btc),
         d_state = buffer(DType::kFloat32, state_numel),
         d_dout = activation_io::UploadAs(backend, act, dout),
         d_dqkv = activation_io::UploadAs(backend, act, dqkv0);
  if (d_dqkv.data() == nullptr) return r;
  backend.AttentionForward(d_out.span(), d_state.span(), d_qkv.span(), s.B, s.T, s.C, s.NH);
  backend.AttentionBackward(d_dqkv.span(), d_dout.span(), d_qkv.span(), d_state.span(), s.B, s.T,
                            s.C, s.NH);
  r.out = activation_io::DownloadWidened(backend, d_out.span());
  r.dqkv = activation_io::DownloadWidened(backend, d_dqkv.span());
  r.state = activation_io::DownloadWidened(backend, d_state.span());
  const absl::Status synced = backend.Synchronize();
  EXPECT_TRUE(synced.ok()) << synced;
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CudnnAttentionTest : public ::testing::TestWithParam<AttentionShape> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        MakeCuda(Precision::kBf16, FusedAttention::kCudnn);
    if (!backend.ok()) {
      COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no CUDA backend with cuDNN attention here: " +
                                      backend.status().ToString());
    }
    backend_ = *std::move(backend);
  }
  std::unique_ptr<Backend> backend_;
};

TEST_P(CudnnAttentionTest, MatchesTheCpuBackendAndRepeatsBitForBit) {
  const AttentionShape s = GetParam();
  const size_t btc = static_cast<size_t>(s.B) * s.T * s.C;
  const std::vector<float> qkv = RoundedToBf16(ref::RandomFloats(3 * btc, 1));
  const std::vector<float> dout = RoundedToBf16(ref::RandomFloats(btc, 2));
  const std::vector<float> dqkv0 = RoundedToBf16(ref::RandomFloats(3 * btc, 3, 0.5f));
  const std::vector<float> zeros(3 * btc, 0.0f);

  CpuBackend cpu(CpuBackendOptions{});
  std::vector<float> want_out(btc), state(cpu.AttentionStateNumel(s.B, s.T, s.C, s.NH));
  std::vector<float> want_grad(3 * btc, 0.0f);
  const auto host = [](auto& v) { return TensorSpan{v.data(), DType::kFloat32, v.size()}; };
  std::vector<float> qkv_copy = qkv, dout_copy = dout;
  cpu.AttentionForward(host(want_out), host(state), host(qkv_copy), s.B, s.T, s.C, s.NH);
  cpu.AttentionBackward(host(want_grad), host(dout_copy), host(qkv_copy), host(state), s.B, s.T,
                        s.C, s.NH);

  ASSERT_EQ(backend_->activation_dtype(), DType::kBFloat16);
  // From a zero dqkv: the gradient itself (cuDNN's bf16, added to 0).
  const Results first = RunAttention(*backend_, s, qkv, dout, zeros);
  ASSERT_EQ(first.dqkv.size(), 3 * btc);
  const std::optional<AttentionChoice> choice = LatestAttentionChoice();
  ASSERT_TRUE(choice.has_value());
  std::cout << "attention implementation: " << AttentionImplementationName(choice->implementation)
            << " (" << choice->reason << ")\n";
  ASSERT_EQ(choice->implementation, AttentionImplementation::kCudnn);
  // The state is the bf16 output and the statistics, not (B,NH,T,T).
  EXPECT_EQ(backend_->AttentionStateNumel(s.B, s.T, s.C, s.NH),
            sdpa::StateLayoutOf({s.B, s.T, s.NH, s.C / s.NH}).numel());

  EXPECT_LE(RelativeError(first.out, want_out), kRelativeTolerance);
  const std::vector<float>& grad = first.dqkv;
  for (int part = 0; part < 3; ++part) {
    const double error = RelativeError(Part(grad, s, part), Part(want_grad, s, part));
    EXPECT_LE(error, kRelativeTolerance) << "d"
                                         << "qkv"[part];
    std::cout << "d"
              << "qkv"[part] << " relative error " << error << "\n";
  }
  std::cout << "out relative error " << RelativeError(first.out, want_out) << "\n";

  // The += contract: from dqkv0, each element is dqkv0 + the gradient in
  // fp32, rounded once.
  const Results accumulated = RunAttention(*backend_, s, qkv, dout, dqkv0);
  ASSERT_EQ(accumulated.dqkv.size(), 3 * btc);
  size_t mismatches = 0;
  for (size_t i = 0; i < grad.size(); ++i) {
    const float want = kernel_math::FloatOfBf16(kernel_math::Bf16Bits(dqkv0[i] + grad[i]));
    if (std::memcmp(&want, &accumulated.dqkv[i], sizeof(float)) != 0) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u) << "dqkv is not dqkv0 + the gradient, rounded once";

  // Run to run: the same bits, on the same backend and on a new one.
  const Results again = RunAttention(*backend_, s, qkv, dout, zeros);
  EXPECT_TRUE(SameBits(again.out, first.out));
  EXPECT_TRUE(SameBits(again.state, first.state));
  EXPECT_TRUE(SameBits(again.dqkv, first.dqkv));
  absl::StatusOr<std::unique_ptr<Backend>> fresh =
      MakeCuda(Precision::kBf16, FusedAttention::kCudnn);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const Results other = RunAttention(**fresh, s, qkv, dout, zeros);
  EXPECT_TRUE(SameBits(other.out, first.out));
  EXPECT_TRUE(SameBits(other.dqkv, first.dqkv));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionTest,
                         ::testing::Values(AttentionShape{2, 64, 64, 4},
                                           AttentionShape{2, 1024, 768, 12}));

class AttentionFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status status = MakeCuda(Precision::kFp32, FusedAttention::kOff).status();
    if (!status.ok()) COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no CUDA backend here: " + status.ToString());
  }
};

TEST_F(AttentionFallbackTest, AutoInFp32RunsTheKernelsAndSaysWhy) {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeCuda(Precision::kFp32, FusedAttention::kAuto);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::optional<AttentionChoice> choice = LatestAttentionChoice();
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->implementation, AttentionImplementation::kKernels);
  EXPECT_NE(choice->reason.find("bf16"), std::string::npos) << choice->reason;
  // The kernels keep the probabilities.
  EXPECT_EQ((*backend)->AttentionStateNumel(2, 64, 64, 4), size_t{2} * 4 * 64 * 64);
}

TEST_F(AttentionFallbackTest, CudnnRequiredInFp32IsRefusedAtCreation) {
  const absl::Status status = MakeCuda(Precision::kFp32, FusedAttention::kCudnn).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(std::string(status.message()).find("--fused_attention=cudnn"), std::string::npos)
      << status;
}

TEST_F(AttentionFallbackTest, AnUnsupportedHeadWidthFallsBackInAutoAndFailsWhenRequired) {
  absl::StatusOr<std::unique_ptr<Backend>> automatic =
      MakeCuda(Precision::kBf16, FusedAttention::kAuto);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  // hs 12 is not a multiple of 8: the kernels, reported.
  const AttentionShape odd{1, 32, 24, 2};
  ASSERT_TRUE((*automatic)->ReserveScratch(PassFor(odd)).ok());
  const std::optional<AttentionChoice> choice = LatestAttentionChoice();
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->implementation, AttentionImplementation::kKernels);
  EXPECT_EQ((*automatic)->AttentionStateNumel(1, 32, 24, 2), size_t{2} * 32 * 32);
  absl::StatusOr<std::unique_ptr<Backend>> required =
      MakeCuda(Precision::kBf16, FusedAttention::kCudnn);
  if (!required.ok())
    COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no cuDNN here: " + required.status().ToString());
  const absl::Status refused = (*required)->ReserveScratch(PassFor(odd));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
}

}  // namespace
}  // namespace cohort::compute
