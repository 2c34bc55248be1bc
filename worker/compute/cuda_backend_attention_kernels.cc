// CudaBackend (cuda_backend_impl.h): causal attention on the backend's own
// kernels, where cuDNN's fused attention is not used (cuda_backend_attention.cc
// chooses). The state is the softmax probabilities (B,NH,T,T), as on the
// CPU. Each (batch, head) is one GEMM of a strided batch over head-major
// copies of q, k and v (the shapes are gemm_shapes.h's).

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {


void CudaBackend::KernelAttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B,
                                         int T, int C, int NH) {
  const size_t btc = Mul(Mul(B, T), C);
  float* y = CheckedF32(out, btc, "attention out");
  float* att = CheckedF32(state, ProbabilitiesNumel(B, T, NH), "attention state");
  const float* x = CheckedF32(qkv, 3 * btc, "qkv");
  if (!Begin()) return;
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

void CudaBackend::KernelAttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv,
                                          TensorSpan state, int B, int T, int C, int NH) {
  const size_t btc = Mul(Mul(B, T), C);
  float* dx = CheckedF32(dqkv, 3 * btc, "dqkv");
  const float* dy = CheckedF32(dout, btc, "attention dout");
  const float* x = CheckedF32(qkv, 3 * btc, "qkv");
  const size_t state_numel = ProbabilitiesNumel(B, T, NH);
  const float* att = CheckedF32(state, state_numel, "attention state");
  if (!Begin()) return;
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
