// The CUDA backend's fused ops (backend.h: MatmulGeluForward, MatmulGeluBackward,
// ResidualLayerNormForward, the cross-entropy backward in place) against the
// CPU backend's unfused ops on the same inputs, and each twice on the GPU
// for the same bits. Two MLP shapes: one the cuBLASLt epilogues take (4C a
// multiple of 8), one they cannot (an aux leading dimension of 300: the
// separate kernels' path). Needs a GPU: skips naming the reason without one
// (fails so under COHORT_GPU_REQUIRED=1).
//
// Tolerances, relative (Frobenius) to the CPU's fp32 results, as
// backend_conformance_test.cc states them: the GEMM-based outputs (pre,
// out, dpre, the weight and bias gradients) 1e-5 in fp32 (the epilogue's
// GELU and its derivative are cuBLASLt's own tanh-approximation code, not
// kernel_math.h's, within a few ulps), 2e-3 in tf32, 1e-2 in bf16 (where
// BGRADB sums the bf16-rounded output gradient the GEMM reads). The residual
// + LayerNorm involves no GEMM: 1e-5 in every precision, and its residual
// sum (one IEEE addition per element) bitwise.
//
// In bf16 the CUDA backend stores activations in bf16 (backend.h,
// "Activation storage"): the inputs are rounded to bf16 on the host and the
// CPU (fp32 storage) runs on those same values; each output stored in bf16
// adds its own rounding, at most 2^-8 relative (bound 4e-3), to the bounds
// above, and the residual sum is compared with the CPU's rounded to bf16.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/gpu_required.h"
#include "tests/unit/compute/activation_io.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/backend_factory.h"

namespace cohort::compute {
namespace {

using ref::Bits;
using ref::RandomFloats;
using ref::RelativeError;
using ref::ToDouble;

// A backend with host-vector plumbing.
class On {
 public:
  explicit On(Backend* backend) : backend_(backend) {}
  // Backend memory holding `host` (float or int32).
  template <typename T>
  TensorSpan Put(const std::vector<T>& host) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t>);
    const DType dtype = std::is_same_v<T, float> ? DType::kFloat32 : DType::kInt32;
    absl::StatusOr<Buffer> buffer = backend_->Allocate(dtype, host.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    backend_->CopyFromHost(buffer->span(), host.data());
    buffers_.push_back(*std::move(buffer));
    return buffers_.back().span();
  }
  // Backend memory of the backend's activation dtype holding `host`
  // (rounded to bf16 where that is the dtype).
  TensorSpan Act(const std::vector<float>& host) {
    buffers_.push_back(activation_io::UploadAs(*backend_, backend_->activation_dtype(), host));
    return buffers_.back().span();
  }
  // fp32 or bf16 memory, widened.
  std::vector<float> Get(TensorSpan span) {
    std::vector<float> host = activation_io::DownloadWidened(*backend_, span);
    EXPECT_TRUE(backend_->Synchronize().ok());
    return host;
  }
  Backend& operator*() { return *backend_; }
  Backend* operator->() { return backend_; }

 private:
  Backend* backend_;
  std::vector<Buffer> buffers_;
};

struct Shape {
  int N, C, OC;  // the fc's: inp (N,C) -> pre (N,OC)
};
constexpr Shape kShapes[] = {{74, 64, 256}, {74, 75, 300}};

std::string Name(const ::testing::TestParamInfo<Precision>& info) {
  return PrecisionName(info.param);
}

class CudaFusedOpsTest : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> gpu =
        CreateBackend(BackendOptions{.kind = BackendKind::kCuda, .precision = GetParam()});
    if (!gpu.ok()) {
      COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no CUDA backend here: " + gpu.status().ToString());
    }
    gpu_ = *std::move(gpu);
    absl::StatusOr<std::unique_ptr<Backend>> cpu =
        CreateBackend(BackendOptions{.kind = BackendKind::kCpu, .num_threads = 1});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = *std::move(cpu);
  }

  bool Bf16Activations() const { return gpu_->activation_dtype() == DType::kBFloat16; }
  // `values` as the GPU stores activations (rounded to bf16 in bf16).
  std::vector<float> AsStored(std::vector<float> values) const {
    return activation_io::AsStored(gpu_->activation_dtype(), std::move(values));
  }
  // A bound plus the rounding of an output stored in bf16.
  double Stored(double bound) const { return Bf16Activations() ? bound + 4e-3 : bound; }

  double ProductTolerance() const {
    switch (GetParam()) {
      case Precision::kTf32:
        return 2e-3;
      case Precision::kBf16:
        return 1e-2;
      default:
        return 1e-5;
    }
  }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_P(CudaFusedOpsTest, MatmulGeluForwardMatchesTheCpusMatmulThenGelu) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N " << s.N << " C " << s.C << " OC " << s.OC);
    const std::vector<float> inp = AsStored(RandomFloats(s.N * s.C, 1, 2.0f));
    const std::vector<float> weight = RandomFloats(s.OC * s.C, 2, 0.2f);
    const std::vector<float> bias = RandomFloats(s.OC, 3);
    const std::vector<float> stale = RandomFloats(s.N * s.OC, 4);
    On cpu(cpu_.get());
    const TensorSpan want_pre = cpu.Put(stale), want_out = cpu.Put(stale);
    cpu->MatmulForward(want_pre, cpu.Put(inp), cpu.Put(weight), cpu.Put(bias), s.N, s.C, s.OC);
    cpu->GeluForward(want_out, want_pre, want_pre.numel);
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      On gpu(gpu_.get());
      const TensorSpan pre = gpu.Act(stale), out = gpu.Act(stale);
      gpu->MatmulGeluForward(out, pre, gpu.Act(inp), gpu.Put(weight), gpu.Put(bias), s.N, s.C,
                             s.OC);
      std::vector<float> got_pre = gpu.Get(pre), got_out = gpu.Get(out);
      EXPECT_LT(RelativeError(got_pre, ToDouble(cpu.Get(want_pre))), Stored(ProductTolerance()));
      EXPECT_LT(RelativeError(got_out, ToDouble(cpu.Get(want_out))), Stored(ProductTolerance()));
      got_pre.insert(got_pre.end(), got_out.begin(), got_out.end());
      runs.push_back(std::move(got_pre));
    }
    EXPECT_EQ(Bits(runs[0]), Bits(runs[1])) << "run to run";
  }
}

TEST_P(CudaFusedOpsTest, MatmulGeluBackwardMatchesTheCpusUnfusedOps) {
  for (const Shape& s : kShapes) {
    // The fcproj's backward: act = gelu(pre) (N, OC) -> dout (N, C).
    SCOPED_TRACE(::testing::Message() << "N " << s.N << " C " << s.OC << " OC " << s.C);
    const int N = s.N, C = s.OC, OC = s.C;
    const std::vector<float> pre = AsStored(RandomFloats(N * C, 11, 3.0f));
    std::vector<float> act(pre.size());
    {
      On cpu(cpu_.get());
      const TensorSpan a = cpu.Put(act);
      cpu->GeluForward(a, cpu.Put(pre), act.size());
      act = AsStored(cpu.Get(a));
    }
    const std::vector<float> weight = RandomFloats(OC * C, 12, 0.2f);
    const std::vector<float> dout = AsStored(RandomFloats(N * OC, 13));
    const std::vector<float> dweight0 = RandomFloats(OC * C, 14);
    const std::vector<float> dbias0 = RandomFloats(OC, 15);
    const std::vector<float> dpre_bias0 = RandomFloats(C, 16);
    const std::vector<float> stale = RandomFloats(N * C, 17);

    On cpu(cpu_.get());
    const TensorSpan w_dweight = cpu.Put(dweight0), w_dbias = cpu.Put(dbias0),
                     w_dpre_bias = cpu.Put(dpre_bias0);
    const TensorSpan w_dpre = cpu.Put(std::vector<float>(N * C, 0.0f));
    const TensorSpan dact = cpu.Put(std::vector<float>(N * C, 0.0f));
    const TensorSpan c_pre = cpu.Put(pre);
    cpu->MatmulBackward(dact, w_dweight, w_dbias, cpu.Put(dout), cpu.Put(act), cpu.Put(weight), N,
                        C, OC);
    cpu->GeluBackward(w_dpre, c_pre, dact, w_dpre.numel);
    // dpre_bias += column sums of dpre, as the fc's MatmulBackward took them.
    cpu->MatmulBackward(TensorSpan{}, cpu.Put(std::vector<float>(C * OC)), w_dpre_bias, w_dpre,
                        cpu.Put(std::vector<float>(N * OC)), cpu.Put(std::vector<float>(C * OC)), N,
                        OC, C);
    const std::vector<float> want_dpre = cpu.Get(w_dpre);

    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      On gpu(gpu_.get());
      const TensorSpan dpre = gpu.Act(stale), dweight = gpu.Put(dweight0), dbias = gpu.Put(dbias0),
                       dpre_bias = gpu.Put(dpre_bias0);
      gpu->MatmulGeluBackward(dpre, dpre_bias, dweight, dbias, gpu.Act(dout), gpu.Act(act),
                              gpu.Act(pre), gpu.Put(weight), N, C, OC);
      std::vector<float> got = gpu.Get(dpre);
      EXPECT_LT(RelativeError(got, ToDouble(want_dpre)), Stored(ProductTolerance()));
      const std::vector<float> got_dweight = gpu.Get(dweight), got_dbias = gpu.Get(dbias),
                               got_dpre_bias = gpu.Get(dpre_bias);
      EXPECT_LT(RelativeError(got_dweight, ToDouble(cpu.Get(w_dweight))), ProductTolerance());
      EXPECT_LT(RelativeError(got_dbias, ToDouble(cpu.Get(w_dbias))), ProductTolerance());
      EXPECT_LT(RelativeError(got_dpre_bias, ToDouble(cpu.Get(w_dpre_bias))), ProductTolerance());
      for (const auto* part : {&got_dweight, &got_dbias, &got_dpre_bias}) {
        got.insert(got.end(), part->begin(), part->end());
      }
      runs.push_back(std::move(got));
    }
    EXPECT_EQ(Bits(runs[0]), Bits(runs[1])) << "run to run";
  }
}

TEST_P(CudaFusedOpsTest, ResidualLayerNormForwardMatchesTheCpusResidualThenLayerNorm) {
  for (const int C : {64, 75, 768}) {
    SCOPED_TRACE(::testing::Message() << "C " << C);
    constexpr int N = 37;
    const std::vector<float> a = AsStored(RandomFloats(N * C, 21, 2.0f)),
                             b = AsStored(RandomFloats(N * C, 22));
    const std::vector<float> weight = RandomFloats(C, 23), bias = RandomFloats(C, 24);
    const std::vector<float> stale = RandomFloats(N * C, 25);
    On cpu(cpu_.get());
    const TensorSpan residual = cpu.Put(stale), out = cpu.Put(stale);
    const TensorSpan mean = cpu.Put(std::vector<float>(N)), rstd = cpu.Put(std::vector<float>(N));
    cpu->ResidualForward(residual, cpu.Put(a), cpu.Put(b), residual.numel);
    // The sum as the GPU stores it (rounded in bf16), which its LayerNorm reads.
    const std::vector<float> want_residual = AsStored(cpu.Get(residual));
    cpu->LayerNormForward(out, mean, rstd, cpu.Put(want_residual), cpu.Put(weight), cpu.Put(bias),
                          N, C);
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      On gpu(gpu_.get());
      const TensorSpan g_residual = gpu.Act(stale), g_out = gpu.Act(stale);
      const TensorSpan g_mean = gpu.Put(std::vector<float>(N)),
                       g_rstd = gpu.Put(std::vector<float>(N));
      gpu->ResidualLayerNormForward(g_residual, g_out, g_mean, g_rstd, gpu.Act(a), gpu.Act(b),
                                    gpu.Put(weight), gpu.Put(bias), N, C);
      std::vector<float> got = gpu.Get(g_residual);
      EXPECT_EQ(Bits(got), Bits(want_residual));
      const std::vector<float> got_out = gpu.Get(g_out), got_mean = gpu.Get(g_mean),
                               got_rstd = gpu.Get(g_rstd);
      EXPECT_LT(RelativeError(got_out, ToDouble(cpu.Get(out))), Stored(1e-5));
      EXPECT_LT(RelativeError(got_mean, ToDouble(cpu.Get(mean))), 1e-5);
      EXPECT_LT(RelativeError(got_rstd, ToDouble(cpu.Get(rstd))), 1e-5);
      for (const auto* part : {&got_out, &got_mean, &got_rstd}) {
        got.insert(got.end(), part->begin(), part->end());
      }
      runs.push_back(std::move(got));
    }
    EXPECT_EQ(Bits(runs[0]), Bits(runs[1])) << "run to run";
  }
}

TEST_P(CudaFusedOpsTest, CrossEntropyBackwardInPlaceGivesTheBitsOfApart) {
  constexpr int N = 9, V = 101, Vp = 112;
  const std::vector<float> logits = RandomFloats(N * Vp, 31, 4.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 17 + 3) % V;
  On gpu(gpu_.get());
  const TensorSpan z = gpu.Act(logits), t = gpu.Put(targets);
  const TensorSpan losses = gpu.Put(std::vector<float>(N)), lse = gpu.Put(std::vector<float>(N));
  const TensorSpan dlosses = gpu.Put(std::vector<float>(N, 1.0f / N));
  gpu->CrossEntropyForward(losses, lse, z, t, N, V, Vp);
  const TensorSpan apart = gpu.Act(std::vector<float>(N * Vp));
  gpu->CrossEntropyBackward(apart, z, lse, t, dlosses, N, V, Vp);
  gpu->CrossEntropyBackward(z, z, lse, t, dlosses, N, V, Vp);
  EXPECT_EQ(Bits(gpu.Get(z)), Bits(gpu.Get(apart)));
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaFusedOpsTest,
                         ::testing::Values(Precision::kFp32, Precision::kTf32, Precision::kBf16),
                         Name);

}  // namespace
}  // namespace cohort::compute
