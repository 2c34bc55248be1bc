// CudaBackend (cuda_backend_impl.h): causal attention on the backend's own
// kernels, where cuDNN's fused attention is not used (cuda_backend_attention.cc
// chooses). The state is the softmax probabilities (B,NH,T,T), as on the
// CPU. Each (batch, head) is one GEMM of a strided batch over head-major
// copies of q, k and v (the shapes are gemm_shapes.h's).
//
// The kernels compute in fp32 on fp32 arrays. With bf16 activations
// (precision bf16) each op widens its bf16 inputs into fp32 scratch
// (kAttentionWide) on entry, runs the fp32 path, and rounds what it stores
// on exit, once: the output, and dqkv as dqkv widened plus the gradient,
// added in fp32. The simplest route that keeps the contract; attention in
// bf16 normally runs on cuDNN (cuda_backend_attention.cc), and this path
// is its fallback.

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {

void CudaBackend::KernelAttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B,
                                         int T, int C, int NH) {
  const size_t btc = Mul(Mul(B, T), C);
  float* att = CheckedF32(state, ProbabilitiesNumel(B, T, NH), "attention state");
  if (activation_dtype() == DType::kFloat32) {
    float* y = CheckedF32(out, btc, "attention out");
    const float* x = CheckedF32(qkv, 3 * btc, "qkv");
    if (!Begin()) return;
    KernelAttentionForwardF32(y, att, x, B, T, C, NH);
    return;
  }
  Bf16* y = CheckedActivation<Bf16>(out, btc, "attention out");
  const Bf16* x = CheckedActivation<const Bf16>(qkv, 3 * btc, "qkv");
  if (!Begin()) return;
  auto* wide =
      static_cast<float*>(Scratch(kAttentionWide, KernelAttentionWideFloats(btc) * sizeof(float)));
  if (wide == nullptr) return;
  float* x32 = wide;
  float* y32 = wide + 6 * btc;
  cuda::WidenBf16(x32, x, static_cast<int64_t>(3 * btc), stream_);
  CheckLaunch("WidenBf16 (qkv)");
  KernelAttentionForwardF32(y32, att, x32, B, T, C, NH);
  if (!Begin()) return;
  cuda::NarrowToBf16(y, y32, static_cast<int64_t>(btc), stream_);
  CheckLaunch("NarrowToBf16 (attention out)");
}

void CudaBackend::KernelAttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv,
                                          TensorSpan state, int B, int T, int C, int NH) {
  const size_t btc = Mul(Mul(B, T), C);
  const float* att = CheckedF32(state, ProbabilitiesNumel(B, T, NH), "attention state");
  if (activation_dtype() == DType::kFloat32) {
    float* dx = CheckedF32(dqkv, 3 * btc, "dqkv");
    const float* dy = CheckedF32(dout, btc, "attention dout");
    const float* x = CheckedF32(qkv, 3 * btc, "qkv");
    if (!Begin()) return;
    KernelAttentionBackwardF32(dx, dy, x, att, B, T, C, NH);
    return;
  }
  Bf16* dx = CheckedActivation<Bf16>(dqkv, 3 * btc, "dqkv");
  const Bf16* dy = CheckedActivation<const Bf16>(dout, btc, "attention dout");
  const Bf16* x = CheckedActivation<const Bf16>(qkv, 3 * btc, "qkv");
  if (!Begin()) return;
  auto* wide =
      static_cast<float*>(Scratch(kAttentionWide, KernelAttentionWideFloats(btc) * sizeof(float)));
  if (wide == nullptr) return;
  float* x32 = wide;
  float* dx32 = wide + 3 * btc;
  float* dy32 = wide + 6 * btc;
  const auto qkv_numel = static_cast<int64_t>(3 * btc);
  cuda::WidenBf16(x32, x, qkv_numel, stream_);
  cuda::WidenBf16(dx32, dx, qkv_numel, stream_);  // accumulated into in fp32
  cuda::WidenBf16(dy32, dy, static_cast<int64_t>(btc), stream_);
  CheckLaunch("WidenBf16 (attention backward)");
  KernelAttentionBackwardF32(dx32, dy32, x32, att, B, T, C, NH);
  if (!Begin()) return;
  cuda::NarrowToBf16(dx, dx32, qkv_numel, stream_);
  CheckLaunch("NarrowToBf16 (dqkv)");
}

// The fp32 path on fp32 arrays (the activations themselves, or the copies
// above); a pending failure skips it.
void CudaBackend::KernelAttentionForwardF32(float* y, float* att, const float* x, int B, int T,
                                            int C, int NH) {
  const size_t btc = Mul(Mul(B, T), C);
  auto* heads = static_cast<float*>(Scratch(kAttentionHeads, 4 * btc * sizeof(float)));
  if (heads == nullptr) return;
  float* q = heads;
  float* k = heads + btc;
  float* v = heads + 2 * btc;
  float* o = heads + 3 * btc;
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const HeadBatch batch{.count = B * NH, .T = T, .hs = hs};
  cuda::SplitQkv(q, k, v, x, B, T, NH, hs, stream_);
  CheckLaunch("SplitQkv");
  // scores (T,T) = scale q (T,hs) k^T; the part above the diagonal is
  // computed and then masked by the softmax.
  BatchedGemm(AttentionScoresGemm(att, q, k, scale, batch));
  cuda::CausalSoftmax(att, static_cast<int64_t>(B) * NH * T, T, stream_);
  CheckLaunch("CausalSoftmax");
  BatchedGemm(AttentionOutputGemm(o, att, v, batch));  // o (T,hs) = att (T,T) v
  cuda::MergeHeads(y, o, B, T, NH, hs, stream_);
  CheckLaunch("MergeHeads");
}

void CudaBackend::KernelAttentionBackwardF32(float* dx, const float* dy, const float* x,
                                             const float* att, int B, int T, int C, int NH) {
  const size_t btc = Mul(Mul(B, T), C);
  const size_t state_numel = ProbabilitiesNumel(B, T, NH);
  auto* heads = static_cast<float*>(Scratch(kAttentionHeads, 4 * btc * sizeof(float)));
  auto* grads = static_cast<float*>(Scratch(kAttentionGrads, 3 * btc * sizeof(float)));
  auto* datt = static_cast<float*>(Scratch(kScoreGrads, state_numel * sizeof(float)));
  if (heads == nullptr || grads == nullptr || datt == nullptr) return;
  float* q = heads;
  float* k = heads + btc;
  float* v = heads + 2 * btc;
  float* dO = heads + 3 * btc;
  float* dq = grads;
  float* dk = grads + btc;
  float* dv = grads + 2 * btc;
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const HeadBatch batch{.count = B * NH, .T = T, .hs = hs};
  cuda::SplitQkv(q, k, v, x, B, T, NH, hs, stream_);
  CheckLaunch("SplitQkv");
  cuda::SplitHeads(dO, dy, B, T, NH, hs, stream_);
  CheckLaunch("SplitHeads");
  BatchedGemm(AttentionProbsGradGemm(datt, dO, v, batch));  // datt (T,T) = dO (T,hs) v^T
  BatchedGemm(AttentionValueGradGemm(dv, att, dO, batch));  // dv (T,hs) = att^T dO
  // datt becomes the gradient of the scaled scores.
  cuda::CausalSoftmaxBackward(datt, att, static_cast<int64_t>(batch.count) * T, T, stream_);
  CheckLaunch("CausalSoftmaxBackward");
  BatchedGemm(AttentionQueryGradGemm(dq, datt, k, scale, batch));  // dq = scale dscores k
  BatchedGemm(AttentionKeyGradGemm(dk, datt, q, scale, batch));    // dk = scale dscores^T q
  cuda::AccumulateQkvGrad(dx, dq, dk, dv, B, T, NH, hs, stream_);
  CheckLaunch("AccumulateQkvGrad");
}

}  // namespace cohort::compute::cuda_impl
