// CudaBackend (cuda_backend_impl.h): the fused ops of backend.h. The MLP's
// halves fold bias, GELU and their gradients into the GEMMs' cuBLASLt
// epilogues (cuda_epilogue.h documents them); where cuBLASLt runs no
// algorithm with the epilogue for a shape, separate kernels compute the same
// thing, chosen once per shape and logged once. The residual add and its
// LayerNorm are one kernel (cuda_kernels_pointwise.cu). Also the bias
// gradient beside a weight gradient (BGRADB), which MatmulBackward shares.

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {

void CudaBackend::AccumulateBiasGrad(float* dbias, const float* partial, int n) {
  if (!Begin()) return;  // the GEMM that was to write `partial` failed
  cuda::ResidualForward(dbias, dbias, partial, static_cast<size_t>(n), stream_);
  CheckLaunch("ResidualForward (bias gradient)");
}

// dweight (OC,C) += dout^T inp, and dbias (OC) += the column sums of dout
// from the same GEMM's BGRADB epilogue (the sums of its B operand, dout,
// over k = N) where cuBLASLt runs it, else from the column-sum kernel. dout
// and inp are activations (bf16 in precision bf16, read as stored: the
// epilogue sums the bf16 dout in fp32, as the kernel does); dweight and
// dbias fp32.
void CudaBackend::WeightAndBiasGrad(float* dweight, float* dbias, const void* dout, const void* inp,
                                    int N, int C, int OC) {
  const GemmCall product = MatmulWeightGradGemm(dweight, dout, inp, N, C, OC);
  const GemmTypes types{.a = ActivationType(), .b = ActivationType(), .c = CUDA_R_32F};
  if (dbias == nullptr || N == 0) {
    Gemm(product, types);
    return;
  }
  // The epilogue writes its sums: they land in scratch and are added.
  auto* partial = static_cast<float*>(
      Scratch(kColumnSums, cuda::ColumnSumScratchFloats(N, OC) * sizeof(float)));
  if (partial == nullptr) return;
  if (Gemm(product, types, {.kind = Epilogue::kBgradB, .bias = partial}) == EpilogueRun::kDone) {
    AccumulateBiasGrad(dbias, partial, OC);
    return;
  }
  Gemm(product, types);
  if (!Begin()) return;
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    cuda::AddColumnSums(dbias, static_cast<const S*>(dout), N, OC, partial, stream_);
  });
  CheckLaunch("AddColumnSums");
}

void CudaBackend::MatmulGeluForward(TensorSpan out, TensorSpan pre, TensorSpan inp,
                                    TensorSpan weight, TensorSpan bias, int N, int C, int OC) {
  const size_t n_oc = Mul(N, OC);
  CheckNotAnInput(out, {pre, inp}, "MatmulGeluForward: out");
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* y = CheckedActivation<S>(out, n_oc, "matmul-gelu out");
    S* z = CheckedActivation<S>(pre, n_oc, "matmul-gelu pre");
    const S* x = CheckedActivation<const S>(inp, Mul(N, C), "matmul-gelu inp");
    const float* w = CheckedF32(weight, Mul(OC, C), "matmul-gelu weight");
    const float* b = OptionalF32(bias, OC, "matmul-gelu bias");
    if (n_oc == 0 || !Begin()) return;
    // out (N,OC) = gelu(pre), pre = inp weight^T + bias kept in the aux
    // matrix (laid out like out: (OC x N) column-major, ld OC). In bf16 the
    // epilogue takes GELU of the fp32 pre-activation and rounds both stores.
    const GemmEpilogue epilogue{
        .kind = b != nullptr ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux, .bias = b, .aux = z};
    if (Gemm(MatmulForwardGemm(y, x, w, N, C, OC, GemmOutput::kWrite),
             {.a = CUDA_R_32F, .b = ActivationType(), .c = ActivationType()},
             epilogue) == EpilogueRun::kDone) {
      return;
    }
    // Unfused: GELU of the stored pre (the bits of MatmulForward then
    // GeluForward, as on the CPU).
    MatmulForward(pre, inp, weight, bias, N, C, OC);
    GeluForward(out, pre, n_oc);
  });
}

void CudaBackend::MatmulGeluBackward(TensorSpan dpre, TensorSpan dpre_bias, TensorSpan dweight,
                                     TensorSpan dbias, TensorSpan dout, TensorSpan act,
                                     TensorSpan pre, TensorSpan weight, int N, int C, int OC) {
  const size_t nc = Mul(N, C);
  CheckNotAnInput(dpre, {act, pre, dout}, "MatmulGeluBackward: dpre");
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* dz = CheckedActivation<S>(dpre, nc, "matmul-gelu dpre");
    float* dzb = OptionalF32(dpre_bias, C, "matmul-gelu dpre_bias");
    float* dw = CheckedF32(dweight, Mul(OC, C), "matmul-gelu dweight");
    float* db = OptionalF32(dbias, OC, "matmul-gelu dbias");
    const S* dy = CheckedActivation<const S>(dout, Mul(N, OC), "matmul-gelu dout");
    const S* a = CheckedActivation<const S>(act, nc, "matmul-gelu act");
    const S* z = CheckedActivation<const S>(pre, nc, "matmul-gelu pre");
    const float* w = CheckedF32(weight, Mul(OC, C), "matmul-gelu weight");
    if (!Begin()) return;
    WeightAndBiasGrad(dw, db, dy, a, N, C, OC);  // dweight += dout^T act, dbias += sums of dout
    if (nc == 0) return;
    // dpre (N,C) = gelu'(pre) * (dout weight): the input-gradient GEMM as a
    // write, its DGELU epilogue reading pre as aux (laid out like dpre), and
    // with DGELU_BGRAD dpre's column sums (of the fp32 gradient, before the
    // store), written to scratch and added.
    GemmCall product = MatmulInputGradGemm(dz, dy, w, N, C, OC);
    product.beta = 0.0f;
    float* partial = nullptr;
    if (dzb != nullptr) {
      partial = static_cast<float*>(
          Scratch(kColumnSums, cuda::ColumnSumScratchFloats(N, C) * sizeof(float)));
      if (partial == nullptr) return;
    }
    // The aux is read only; cuBLASLt's attribute is one pointer for both ways.
    const GemmEpilogue epilogue{.kind = dzb != nullptr ? Epilogue::kDGeluBgrad : Epilogue::kDGelu,
                                .bias = partial,
                                .aux = const_cast<S*>(z)};
    if (Gemm(product, {.a = CUDA_R_32F, .b = ActivationType(), .c = ActivationType()}, epilogue) ==
        EpilogueRun::kDone) {
      if (dzb != nullptr) AccumulateBiasGrad(dzb, partial, C);
      return;
    }
    // Unfused: dout weight in fp32 (dpre itself where activations are fp32),
    // then the GELU's gradient applied and the result stored once.
    float* grad = UnfusedProduct(dz, nc);
    if (grad == nullptr) return;
    GemmCall product32 = MatmulInputGradGemm(grad, dy, w, N, C, OC);
    product32.beta = 0.0f;
    Gemm(product32, {.a = CUDA_R_32F, .b = ActivationType(), .c = CUDA_R_32F});
    if (!Begin()) return;
    cuda::GeluGradFromProduct(dz, grad, z, nc, stream_);
    CheckLaunch("GeluGradFromProduct");
    if (dzb != nullptr) {
      cuda::AddColumnSums(dzb, static_cast<const S*>(dz), N, C, partial, stream_);
      CheckLaunch("AddColumnSums");
    }
  });
}

void CudaBackend::ResidualLayerNormForward(TensorSpan residual_out, TensorSpan out, TensorSpan mean,
                                           TensorSpan rstd, TensorSpan inp1, TensorSpan inp2,
                                           TensorSpan weight, TensorSpan bias, int N, int C) {
  const size_t nc = Mul(N, C);
  CheckNotAnInput(residual_out, {inp1, inp2}, "ResidualLayerNormForward: residual_out");
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* r = CheckedActivation<S>(residual_out, nc, "residual-layernorm residual_out");
    S* y = CheckedActivation<S>(out, nc, "residual-layernorm out");
    float* m = CheckedF32(mean, N, "residual-layernorm mean");
    float* s = CheckedF32(rstd, N, "residual-layernorm rstd");
    const S* a = CheckedActivation<const S>(inp1, nc, "residual-layernorm inp1");
    const S* b = CheckedActivation<const S>(inp2, nc, "residual-layernorm inp2");
    const float* w = CheckedF32(weight, C, "residual-layernorm weight");
    const float* c = CheckedF32(bias, C, "residual-layernorm bias");
    Launch("ResidualLayerNormForward",
           [&] { cuda::ResidualLayerNormForward(r, y, m, s, a, b, w, c, N, C, stream_); });
  });
}

}  // namespace cohort::compute::cuda_impl
