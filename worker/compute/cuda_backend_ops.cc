// CudaBackend (cuda_backend_impl.h): the ops that are kernels of our own
// (cuda_kernels.h, cuda_kernels_optimizer.h): encoder, LayerNorm, pointwise,
// cross-entropy, and the optimizer's step on device memory.

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {

// ---- Encoder, LayerNorm, pointwise --------------------------------------------
// Each op takes its activations in the backend's storage (WithStorage,
// activation_access.h: fp32, or bf16 in precision bf16) and the rest fp32.

void CudaBackend::EncoderForwardShard(TensorSpan out, TensorSpan inp, TensorSpan wte,
                                      TensorSpan wpe, int vocab_start, int Vs, int B, int T,
                                      int C) {
  CheckVocabShard(vocab_start, Vs);
  const size_t bt = Mul(B, T);
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* y = CheckedActivation<S>(out, bt * C, "encoder out");
    const int32_t* ids = CheckedI32(inp, bt, "encoder inp");
    const float* table = CheckedF32(wte, Mul(Vs, C), "wte");
    const float* positions = OptionalF32(wpe, Mul(T, C), "wpe");
    Launch("EncoderForwardShard", [&] {
      cuda::EncoderForwardShard(y, ids, table, positions, vocab_start, Vs, B, T, C, stream_);
    });
  });
}

void CudaBackend::EncoderBackwardShard(TensorSpan dwte, TensorSpan dwpe, TensorSpan dout,
                                       TensorSpan inp, int vocab_start, int Vs, int B, int T,
                                       int C) {
  CheckVocabShard(vocab_start, Vs);
  const size_t bt = Mul(B, T);
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    float* dtable = CheckedF32(dwte, Mul(Vs, C), "dwte");
    float* dpositions = OptionalF32(dwpe, Mul(T, C), "dwpe");
    const S* dy = CheckedActivation<const S>(dout, bt * C, "encoder dout");
    const int32_t* ids = CheckedI32(inp, bt, "encoder inp");
    if (!Begin()) return;
    void* sort = Scratch(kEncoderSort, cuda::EncoderBackwardScratchBytes(B * T, Vs));
    if (sort == nullptr) return;
    // The sort reports its own failures (not only launch errors).
    Check(cuda::EncoderBackwardShard(dtable, dpositions, dy, ids, vocab_start, Vs, B, T, C, sort,
                                     stream_),
          "EncoderBackwardShard's token sort");
    CheckLaunch("EncoderBackwardShard");
  });
}

void CudaBackend::LayerNormForward(TensorSpan out, TensorSpan mean, TensorSpan rstd, TensorSpan inp,
                                   TensorSpan weight, TensorSpan bias, int N, int C) {
  const size_t nc = Mul(N, C);
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* y = CheckedActivation<S>(out, nc, "ln out");
    float* m = CheckedF32(mean, N, "ln mean");
    float* s = CheckedF32(rstd, N, "ln rstd");
    const S* x = CheckedActivation<const S>(inp, nc, "ln inp");
    const float* w = CheckedF32(weight, C, "ln weight");
    const float* b = CheckedF32(bias, C, "ln bias");
    Launch("LayerNormForward", [&] { cuda::LayerNormForward(y, m, s, x, w, b, N, C, stream_); });
  });
}

void CudaBackend::LayerNormBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias,
                                    TensorSpan dout, TensorSpan inp, TensorSpan weight,
                                    TensorSpan mean, TensorSpan rstd, int N, int C) {
  const size_t nc = Mul(N, C);
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* dx = CheckedActivation<S>(dinp, nc, "ln dinp");
    float* dw = CheckedF32(dweight, C, "ln dweight");
    float* db = CheckedF32(dbias, C, "ln dbias");
    const S* dy = CheckedActivation<const S>(dout, nc, "ln dout");
    const S* x = CheckedActivation<const S>(inp, nc, "ln inp");
    const float* w = CheckedF32(weight, C, "ln weight");
    const float* m = CheckedF32(mean, N, "ln mean");
    const float* s = CheckedF32(rstd, N, "ln rstd");
    if (!Begin()) return;
    auto* partial = static_cast<float*>(
        Scratch(kColumnSums, cuda::ColumnSumScratchFloats(N, C) * sizeof(float)));
    if (partial == nullptr) return;
    cuda::LayerNormBackward(dx, dw, db, dy, x, w, m, s, N, C, partial, stream_);
    CheckLaunch("LayerNormBackward");
  });
}

void CudaBackend::GeluForward(TensorSpan out, TensorSpan inp, size_t n) {
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* y = CheckedActivation<S>(out, n, "gelu out");
    const S* x = CheckedActivation<const S>(inp, n, "gelu inp");
    if (n == 0) return;
    Launch("GeluForward", [&] { cuda::GeluForward(y, x, n, stream_); });
  });
}

void CudaBackend::GeluBackward(TensorSpan dinp, TensorSpan inp, TensorSpan dout, size_t n) {
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* dx = CheckedActivation<S>(dinp, n, "gelu dinp");
    const S* x = CheckedActivation<const S>(inp, n, "gelu inp");
    const S* dy = CheckedActivation<const S>(dout, n, "gelu dout");
    if (n == 0) return;
    Launch("GeluBackward", [&] { cuda::GeluBackward(dx, x, dy, n, stream_); });
  });
}

// Also the gradient tree's folds over fp32 parameter-gradient arenas
// (backend.h): the three spans share one dtype, fp32 or the activations'.
void CudaBackend::ResidualForward(TensorSpan out, TensorSpan inp1, TensorSpan inp2, size_t n) {
  CHECK(out.dtype == DType::kFloat32 || out.dtype == activation_dtype())
      << "residual out: " << DTypeName(out.dtype) << " is neither float32 nor the activations' "
      << DTypeName(activation_dtype());
  WithStorage(out.dtype, [&](auto storage) {
    using S = decltype(storage);
    S* y = CheckedActivation<S>(out, n, "residual out");
    const S* a = CheckedActivation<const S>(inp1, n, "residual inp1");
    const S* b = CheckedActivation<const S>(inp2, n, "residual inp2");
    if (n == 0) return;
    Launch("ResidualForward", [&] { cuda::ResidualForward(y, a, b, n, stream_); });
  });
}

void CudaBackend::ResidualBackward(TensorSpan dinp1, TensorSpan dinp2, TensorSpan dout, size_t n) {
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* da = CheckedActivation<S>(dinp1, n, "residual dinp1");
    S* db = CheckedActivation<S>(dinp2, n, "residual dinp2");
    const S* dy = CheckedActivation<const S>(dout, n, "residual dout");
    if (n == 0) return;
    Launch("ResidualBackward", [&] { cuda::ResidualBackward(da, db, dy, n, stream_); });
  });
}

// ---- Cross-entropy --------------------------------------------------------------
// The logits and dlogits are activations; losses, lse, row_max, sums and
// dlosses fp32.

void CudaBackend::CrossEntropyForward(TensorSpan losses, TensorSpan lse, TensorSpan logits,
                                      TensorSpan targets, int N, int V, int Vp) {
  CHECK(V > 0 && V <= Vp) << "V=" << V << " Vp=" << Vp;
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    float* l = CheckedF32(losses, N, "losses");
    float* s = CheckedF32(lse, N, "lse");
    const S* z = CheckedActivation<const S>(logits, Mul(N, Vp), "logits");
    const int32_t* t = CheckedI32(targets, N, "targets");
    Launch("CrossEntropyForward",
           [&] { cuda::CrossEntropyForward(l, s, z, t, N, V, Vp, stream_); });
  });
}

void CudaBackend::CrossEntropyShardMax(TensorSpan row_max, TensorSpan logits, int N, int V, int Vs,
                                       int vocab_start) {
  CheckVocabShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    float* m = CheckedF32(row_max, N, "row_max");
    const S* z = CheckedActivation<const S>(logits, Mul(N, Vs), "logits");
    Launch("CrossEntropyShardMax",
           [&] { cuda::CrossEntropyShardMax(m, z, N, V, Vs, vocab_start, stream_); });
  });
}

void CudaBackend::CrossEntropyShardSums(TensorSpan sums, TensorSpan logits, TensorSpan row_max,
                                        TensorSpan targets, int N, int V, int Vs, int vocab_start) {
  CheckVocabShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    float* out = CheckedF32(sums, Mul(2, N), "sums");
    const S* z = CheckedActivation<const S>(logits, Mul(N, Vs), "logits");
    const float* m = CheckedF32(row_max, N, "row_max");
    const int32_t* t = CheckedI32(targets, N, "targets");
    Launch("CrossEntropyShardSums",
           [&] { cuda::CrossEntropyShardSums(out, z, m, t, N, V, Vs, vocab_start, stream_); });
  });
}

void CudaBackend::CrossEntropyShardFinish(TensorSpan losses, TensorSpan lse, TensorSpan row_max,
                                          TensorSpan sums, int N) {
  float* l = CheckedF32(losses, N, "losses");
  float* s = CheckedF32(lse, N, "lse");
  const float* m = CheckedF32(row_max, N, "row_max");
  const float* in = CheckedF32(sums, Mul(2, N), "sums");
  Launch("CrossEntropyShardFinish",
         [&] { cuda::CrossEntropyShardFinish(l, s, m, in, N, stream_); });
}

void CudaBackend::CrossEntropyShardBackward(TensorSpan dlogits, TensorSpan logits, TensorSpan lse,
                                            TensorSpan targets, TensorSpan dlosses, int N, int V,
                                            int Vs, int vocab_start) {
  CheckVocabShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  CheckInPlaceOrApart(dlogits, logits);
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* dz = CheckedActivation<S>(dlogits, Mul(N, Vs), "dlogits");
    const S* z = CheckedActivation<const S>(logits, Mul(N, Vs), "logits");
    const float* s = CheckedF32(lse, N, "lse");
    const int32_t* t = CheckedI32(targets, N, "targets");
    const float* dl = CheckedF32(dlosses, N, "dlosses");
    Launch("CrossEntropyShardBackward", [&] {
      cuda::CrossEntropyShardBackward(dz, z, s, t, dl, N, V, Vs, vocab_start, stream_);
    });
  });
}

void CudaBackend::CopyWithin(TensorSpan dst, TensorSpan src) {
  CheckCopyWithin(dst, src);
  if (dst.numel == 0 || !Begin()) return;
  Check(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync (device to device)");
}

// The optimizer ops (backend.h): the piece table and the sums are device
// memory like every span; the kernels are cuda_kernels_optimizer.cu's.
void CudaBackend::SumOfSquaresPieces(TensorSpan sums, TensorSpan grads, TensorSpan pieces) {
  // Checks both spans' dtypes and their sizes against each other.
  const size_t count = CheckedPieceCount(sums, pieces);
  auto* out = static_cast<double*>(sums.data);
  const auto* bounds = static_cast<const int64_t*>(pieces.data);
  const float* x = CheckedF32(grads, 0, "grads");
  if (count == 0) return;
  Launch("SumOfSquaresPieces",
         [&] { cuda::SumOfSquaresPieces(out, x, bounds, static_cast<int64_t>(count), stream_); });
}

void CudaBackend::FinishGradNorm(TensorSpan scalars, TensorSpan sums, double max_norm) {
  double* out = CheckedF64(scalars, 2, "scalars");
  const double* in = CheckedF64(sums, 0, "sums");
  Launch("FinishGradNorm", [&] {
    cuda::FinishGradNorm(out, in, static_cast<int64_t>(sums.numel), max_norm, stream_);
  });
}

void CudaBackend::SumLosses(TensorSpan sum, TensorSpan losses) {
  double* out = CheckedF64(sum, 1, "loss sum");
  const float* in = CheckedF32(losses, losses.numel, "losses");
  Launch("SumLosses",
         [&] { cuda::SumLosses(out, in, static_cast<int64_t>(losses.numel), stream_); });
}

void CudaBackend::SkipUpdateUnlessFinite(TensorSpan scalars, TensorSpan values) {
  double* out = CheckedF64(scalars, 2, "scalars");
  const double* in = CheckedF64(values, 0, "values");
  Launch("SkipUpdateUnlessFinite", [&] {
    cuda::SkipUpdateUnlessFinite(out, in, static_cast<int64_t>(values.numel), stream_);
  });
}

void CudaBackend::ClipAdamW(TensorSpan params, TensorSpan m, TensorSpan v, TensorSpan grads,
                            TensorSpan scalars, size_t begin, size_t end, size_t moment_base,
                            bool decay, const AdamWScalars& adamw) {
  CheckAdamWRange(params, m, v, grads, scalars, begin, end, moment_base);
  if (end == begin) return;
  Launch("ClipAdamW", [&] {
    cuda::ClipAdamW(static_cast<float*>(params.data), static_cast<float*>(m.data),
                    static_cast<float*>(v.data), static_cast<const float*>(grads.data),
                    static_cast<const double*>(scalars.data), static_cast<int64_t>(begin),
                    static_cast<int64_t>(end), static_cast<int64_t>(moment_base), decay, adamw,
                    // Fused: the working copy of what it updates (backend.h).
                    param_copy_.has_value() && params.data == param_copy_->params &&
                            params.numel == param_copy_->numel
                        ? CopyRef()
                        : cuda::ParamCopyRef{},
                    stream_);
  });
}

}  // namespace cohort::compute::cuda_impl
