// CudaBackend (cuda_backend_impl.h): the GEMMs through cuBLASLt (one plan per
// shape and alignment, gemm_shapes.h's calls), the linear layers, and the
// strided batches of attention's products on the kernels' path
// (cuda_backend_attention.cc).

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {

// ---- GEMMs ------------------------------------------------------------------

// The GEMMs' arithmetic is pinned here so that nothing outside the job (an
// environment variable, a library default) changes what a precision
// computes:
// - fp32: CUBLAS_COMPUTE_32F_PEDANTIC, and the cuBLAS handle's math mode
//   CUBLAS_PEDANTIC_MATH. cublas_api.h defines the pedantic types as
//   "standard arithmetic and exact specified internal storage format": no
//   TF32 tensor cores whatever NVIDIA_TF32_OVERRIDE says, and none of the
//   fp32 emulations (BF16x9) that newer cuBLAS releases can switch on from
//   the environment, whose bits differ from IEEE fp32's. The plain
//   CUBLAS_COMPUTE_32F promises only "at least" fp32's precision, which
//   leaves that choice to the library and its environment.
// - tf32: CUBLAS_COMPUTE_32F_FAST_TF32 (and the TF32 math mode). There the
//   danger is the other way: NVIDIA_TF32_OVERRIDE=0 overrides the program
//   and computes in full fp32, so creation is refused under it
//   (CheckTf32Override, gemm_shapes.h) rather than silently giving other
//   results than the same job elsewhere.
// - bf16: CUBLAS_COMPUTE_32F over bf16 operands (the default math mode),
//   fp32 scale; C and D bf16 where they are activations (the accumulator
//   rounded once on the store, beta C widened into it first), fp32 where
//   they are weight gradients.
//   TF32 and the fp32 emulations apply to fp32 operands only (a bf16
//   product is exact in fp32), so those variables do not reach these GEMMs;
//   pedantic here could only keep cuBLAS from its tensor-core kernels.
absl::Status CudaBackend::PinGemmMath() {
  RETURN_IF_ERROR(CheckTf32Override(options_.precision, std::getenv("NVIDIA_TF32_OVERRIDE")));
  cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
  switch (options_.precision) {
    case Precision::kFp32:
      compute_type_ = CUBLAS_COMPUTE_32F_PEDANTIC;
      math_mode = CUBLAS_PEDANTIC_MATH;
      break;
    case Precision::kTf32:
      compute_type_ = CUBLAS_COMPUTE_32F_FAST_TF32;
      math_mode = CUBLAS_TF32_TENSOR_OP_MATH;
      break;
    case Precision::kBf16:
      compute_type_ = CUBLAS_COMPUTE_32F;
      math_mode = CUBLAS_DEFAULT_MATH;
      break;
  }
  const cublasStatus_t set = cublasSetMathMode(blas_, math_mode);
  if (set != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cublasSetMathMode: ", BlasErrorText(set)));
  }
  return absl::OkStatus();
}

bool CudaBackend::SetEpiloguePointers(const GemmPlan& plan, const GemmShape& shape,
                                      const GemmEpilogue& epilogue) {
  auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
    const cublasStatus_t status =
        cublasLtMatmulDescSetAttribute(plan.desc, attribute, value, bytes);
    CheckBlas(status, "cublasLtMatmulDescSetAttribute (epilogue)");
    return status == CUBLAS_STATUS_SUCCESS;
  };
  if (UsesBias(epilogue.kind) &&
      !set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue.bias, sizeof(epilogue.bias))) {
    return false;
  }
  if (UsesAux(epilogue.kind)) {
    const int64_t aux_ld = shape.ldc;  // in elements of the aux's type
    if (!set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epilogue.aux, sizeof(epilogue.aux)) ||
        !set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld))) {
      return false;
    }
  }
  return true;
}

const GemmPlan* CudaBackend::PlanFor(const PlanKey& key, const GemmEpilogue& epilogue) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return &found->second;
  const GemmShape& shape = key.shape;
  GemmPlan plan;
  const cublasLtEpilogue_t lt_epilogue = LtEpilogue(key.epilogue);
  if (UsesAux(key.epilogue) && shape.ldc % 8 != 0) {
    // cublasLt.h: the aux leading dimension must be a multiple of 8.
    plan.unfused = true;
    LOG(WARNING) << "cuBLASLt's " << EpilogueName(key.epilogue) << " epilogue needs an aux "
                 << "leading dimension divisible by 8, and a " << shape.m << "x" << shape.n << "x"
                 << shape.k << " GEMM has " << shape.ldc << " on CUDA device "
                 << options_.device_index << "; separate kernels compute it";
    return &plans_.emplace(key, plan).first->second;
  }
  auto fail = [&](cublasStatus_t status, const char* what) {
    CheckBlas(status, what);
    return status != CUBLAS_STATUS_SUCCESS;
  };
  auto destroy = [&plan] {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
  };
  static constexpr int32_t kBiasType = CUDA_R_32F;
  const int32_t aux_type = ActivationType();
  const cublasOperation_t op_a = shape.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = shape.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (fail(cublasLtMatmulDescCreate(&plan.desc, compute_type_, CUDA_R_32F),
           "cublasLtMatmulDescCreate") ||
      fail(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                          sizeof(op_a)),
           "cublasLtMatmulDescSetAttribute") ||
      fail(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                          sizeof(op_b)),
           "cublasLtMatmulDescSetAttribute") ||
      fail(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt_epilogue,
                                          sizeof(lt_epilogue)),
           "cublasLtMatmulDescSetAttribute") ||
      // The vectors are fp32 whatever D is; cuBLASLt would take D's type.
      (UsesBias(key.epilogue) &&
       fail(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                           &kBiasType, sizeof(kBiasType)),
            "cublasLtMatmulDescSetAttribute (bias type)")) ||
      // The aux (pre-activation) is an activation, of the activation dtype.
      (UsesAux(key.epilogue) &&
       fail(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                           &aux_type, sizeof(aux_type)),
            "cublasLtMatmulDescSetAttribute (aux type)")) ||
      fail(cublasLtMatrixLayoutCreate(&plan.a, operand_type_, shape.a_rows(), shape.a_cols(),
                                      shape.lda),
           "cublasLtMatrixLayoutCreate") ||
      fail(cublasLtMatrixLayoutCreate(&plan.b, operand_type_, shape.b_rows(), shape.b_cols(),
                                      shape.ldb),
           "cublasLtMatrixLayoutCreate") ||
      fail(cublasLtMatrixLayoutCreate(&plan.c, key.c_type, shape.m, shape.n, shape.ldc),
           "cublasLtMatrixLayoutCreate") ||
      !SetEpiloguePointers(plan, shape, epilogue)) {
    destroy();
    return nullptr;
  }
  // The algorithm is chosen once per shape and kept: the heuristic's choice
  // could otherwise differ between calls, and with it the summation order.
  // Split-K reductions done in place in the output are left out (their
  // partial sums may land in any order).
  cublasLtMatmulPreference_t preference = nullptr;
  const uint64_t workspace = kWorkspaceBytes;
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                           CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  cublasLtMatmulHeuristicResult_t results[kHeuristicResults] = {};
  int found_algos = 0;
  auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const void* value,
                    size_t bytes) {
    return !fail(cublasLtMatmulPreferenceSetAttribute(preference, attribute, value, bytes),
                 "cublasLtMatmulPreferenceSetAttribute");
  };
  bool asked =
      !fail(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate") &&
      prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)) &&
      prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)) &&
      prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof(uint32_t)) &&
      prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof(uint32_t)) &&
      prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof(uint32_t)) &&
      prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof(uint32_t));
  if (asked) {
    const cublasStatus_t heuristic =
        cublasLtMatmulAlgoGetHeuristic(lt_, plan.desc, plan.a, plan.b, plan.c, plan.c, preference,
                                       kHeuristicResults, results, &found_algos);
    // NOT_SUPPORTED: no heuristic for this configuration, which is no
    // algorithm, not a failure.
    if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED) {
      found_algos = 0;
    } else {
      asked = !fail(heuristic, "cublasLtMatmulAlgoGetHeuristic");
    }
  }
  if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
  if (!asked) {
    destroy();
    return nullptr;
  }
  // Only a result whose state is success is usable (cublasLt.h: the other
  // fields are valid only then).
  const cublasLtMatmulHeuristicResult_t* usable = nullptr;
  for (int i = 0; i < std::min(found_algos, kHeuristicResults) && usable == nullptr; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) usable = &results[i];
  }
  if (usable != nullptr) {
    plan.algo = usable->algo;
  } else if (key.epilogue != Epilogue::kNone) {
    // The product alone has its own plan (with cublasGemmEx behind it where
    // needed); the epilogue's work goes to separate kernels.
    plan.unfused = true;
    destroy();
    plan.desc = nullptr;
    plan.a = plan.b = plan.c = nullptr;
    LOG(WARNING) << "cuBLASLt has no algorithm with the " << EpilogueName(key.epilogue)
                 << " epilogue for a " << shape.m << "x" << shape.n << "x" << shape.k
                 << " GEMM (transa " << shape.transa << ", transb " << shape.transb << ", ld "
                 << shape.lda << "/" << shape.ldb << "/" << shape.ldc << ") with "
                 << (bf16_ ? "bf16" : "fp32") << " operands, "
                 << (key.c_type == CUDA_R_16BF ? "bf16" : "fp32") << " output, aligned to "
                 << key.align_a << "/" << key.align_b << "/" << key.align_c << " bytes, vectors to "
                 << key.align_bias << "/" << key.align_aux << ", on CUDA device "
                 << options_.device_index << "; separate kernels compute it, in the same precision";
  } else {
    // Logged once: the plan is kept, so the shape never asks again.
    plan.gemm_ex = true;
    LOG(WARNING) << "cuBLASLt has no algorithm for a " << shape.m << "x" << shape.n << "x"
                 << shape.k << " GEMM (transa " << shape.transa << ", transb " << shape.transb
                 << ", ld " << shape.lda << "/" << shape.ldb << "/" << shape.ldc << ") with "
                 << (bf16_ ? "bf16" : "fp32") << " operands, "
                 << (key.c_type == CUDA_R_16BF ? "bf16" : "fp32") << " output, aligned to "
                 << key.align_a << "/" << key.align_b << "/" << key.align_c
                 << " bytes on CUDA device " << options_.device_index
                 << "; cublasGemmEx computes this shape, in the same precision";
  }
  return &plans_.emplace(key, plan).first->second;
}

const void* CudaBackend::CopiedOperand(const float* data, int rows, int64_t cols, int* ld) const {
  if (!param_copy_.has_value()) return nullptr;
  // Addresses compared as integers: `data` may lie in another buffer.
  const auto at = reinterpret_cast<uintptr_t>(data);
  const auto base = reinterpret_cast<uintptr_t>(param_copy_->params);
  if (at < base || at >= base + param_copy_->numel * sizeof(float)) return nullptr;
  const std::optional<ParamCopyView> view =
      param_copy_->layout.Find((at - base) / sizeof(float), rows, cols, *ld);
  if (!view.has_value()) return nullptr;
  *ld = view->ld;
  return static_cast<const uint16_t*>(param_copy_->copy) + view->copy_offset;
}

const void* CudaBackend::Operand(const void* data, cudaDataType_t type, int rows, int64_t cols,
                                 int* ld, ScratchSlot slot) {
  if (type == CUDA_R_16BF) {
    // A bf16 activation: what the GEMM reads, as stored (no rounding pass).
    CHECK(bf16_) << "a bf16 GEMM operand outside precision bf16";
    return data;
  }
  if (!bf16_) return data;
  const auto* values = static_cast<const float*>(data);
  // A weight of the attached arena: its working copy holds exactly what the
  // rounding below would write (param_copy_layout.h).
  if (const void* copied = CopiedOperand(values, rows, cols, ld); copied != nullptr) {
    return copied;
  }
  const int padded = BfloatLeadingDimension(rows);
  void* rounded = Scratch(slot, Mul(padded, cols) * sizeof(uint16_t));
  if (rounded == nullptr) return nullptr;
  cuda::RoundToBf16(static_cast<uint16_t*>(rounded), values, rows, cols, *ld, padded, stream_);
  CheckLaunch("RoundToBf16");
  *ld = padded;
  return rounded;
}

EpilogueRun CudaBackend::Gemm(const GemmCall& call, const GemmTypes& types,
                              const GemmEpilogue& epilogue) {
  CHECK(call.shape.batch == 1) << "Gemm takes one GEMM; a batch goes to BatchedGemm";
  CHECK(types.c == CUDA_R_32F || (bf16_ && types.c == CUDA_R_16BF))
      << "a GEMM output of type " << types.c << " in precision "
      << PrecisionName(options_.precision);
  // Nothing to write; cuBLASLt refuses it. (No caller fuses an epilogue
  // into an empty product: the ops return before.)
  if (call.shape.m == 0 || call.shape.n == 0) return EpilogueRun::kDone;
  PlanKey key{.shape = call.shape, .c_type = types.c, .epilogue = epilogue.kind};
  if (UsesBias(epilogue.kind)) key.align_bias = AlignmentOf(epilogue.bias, 0, sizeof(float));
  if (UsesAux(epilogue.kind)) {
    key.align_aux = AlignmentOf(epilogue.aux, call.shape.ldc, CudaTypeBytes(ActivationType()));
  }
  GemmShape& shape = key.shape;
  const void* a = Operand(call.a, types.a, shape.a_rows(), shape.a_cols(), &shape.lda, kOperandA);
  const void* b = Operand(call.b, types.b, shape.b_rows(), shape.b_cols(), &shape.ldb, kOperandB);
  if (a == nullptr || b == nullptr) return EpilogueRun::kDone;
  const size_t operand_bytes = CudaTypeBytes(operand_type_);
  key.align_a = AlignmentOf(a, shape.lda, operand_bytes);
  key.align_b = AlignmentOf(b, shape.ldb, operand_bytes);
  key.align_c = AlignmentOf(call.c, shape.ldc, CudaTypeBytes(types.c));
  const GemmPlan* plan = PlanFor(key, epilogue);
  if (plan == nullptr) return EpilogueRun::kDone;
  if (plan->unfused) return EpilogueRun::kUnfused;
  if (epilogue.kind != Epilogue::kNone && !SetEpiloguePointers(*plan, shape, epilogue)) {
    return EpilogueRun::kDone;
  }
  if (plan->gemm_ex) {
    CheckBlas(
        cublasGemmEx(blas_, shape.transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                     shape.transb ? CUBLAS_OP_T : CUBLAS_OP_N, shape.m, shape.n, shape.k,
                     &call.alpha, a, operand_type_, shape.lda, b, operand_type_, shape.ldb,
                     &call.beta, call.c, types.c, shape.ldc, compute_type_, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
    return EpilogueRun::kDone;
  }
  CheckBlas(cublasLtMatmul(lt_, plan->desc, &call.alpha, a, plan->a, b, plan->b, &call.beta, call.c,
                           plan->c, call.c, plan->c, &plan->algo, lt_workspace_, kWorkspaceBytes,
                           stream_),
            "cublasLtMatmul");
  return EpilogueRun::kDone;
}

void CudaBackend::BatchedGemm(const GemmCall& call) {
  GemmShape shape = call.shape;
  if (shape.m == 0 || shape.n == 0 || shape.batch == 0) return;
  // Each batch's matrices are packed (stride = ld x columns), so a batch is
  // one matrix of batch x columns columns: rounded and padded in one go.
  CHECK(shape.stride_a == int64_t{shape.lda} * shape.a_cols() &&
        shape.stride_b == int64_t{shape.ldb} * shape.b_cols())
      << "BatchedGemm wants packed batches";
  const void* a = Operand(call.a, CUDA_R_32F, shape.a_rows(), int64_t{shape.a_cols()} * shape.batch,
                          &shape.lda, kOperandA);
  const void* b = Operand(call.b, CUDA_R_32F, shape.b_rows(), int64_t{shape.b_cols()} * shape.batch,
                          &shape.ldb, kOperandB);
  if (a == nullptr || b == nullptr) return;
  shape.stride_a = int64_t{shape.lda} * shape.a_cols();
  shape.stride_b = int64_t{shape.ldb} * shape.b_cols();
  CheckBlas(cublasGemmStridedBatchedEx(blas_, shape.transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       shape.transb ? CUBLAS_OP_T : CUBLAS_OP_N, shape.m, shape.n,
                                       shape.k, &call.alpha, a, operand_type_, shape.lda,
                                       shape.stride_a, b, operand_type_, shape.ldb, shape.stride_b,
                                       &call.beta, call.c, CUDA_R_32F, shape.ldc, shape.stride_c,
                                       shape.batch, compute_type_, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx");
}

// ---- Linear -------------------------------------------------------------------
// Each product's shape is gemm_shapes.h's (tested on the CPU against
// cblas_sgemm in column-major form). The activations (inp, out, dinp, dout)
// are the activation dtype's; weight, bias and their gradients fp32.

void CudaBackend::MatmulForward(TensorSpan out, TensorSpan inp, TensorSpan weight, TensorSpan bias,
                                int N, int C, int OC) {
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* y = CheckedActivation<S>(out, Mul(N, OC), "matmul out");
    const S* x = CheckedActivation<const S>(inp, Mul(N, C), "matmul inp");
    const float* w = CheckedF32(weight, Mul(OC, C), "matmul weight");
    const float* b = OptionalF32(bias, OC, "bias");
    if (!Begin()) return;
    // out (N,OC) = inp (N,C) weight^T + bias, the bias in the GEMM's epilogue.
    const GemmTypes types{.a = CUDA_R_32F, .b = ActivationType(), .c = ActivationType()};
    const GemmCall product = MatmulForwardGemm(y, x, w, N, C, OC, GemmOutput::kWrite);
    if (b == nullptr) {
      Gemm(product, types);
      return;
    }
    if (Gemm(product, types, {.kind = Epilogue::kBias, .bias = b}) == EpilogueRun::kDone) return;
    // Unfused: the fp32 product, then the bias added and the sum stored
    // (rounded once in bf16).
    float* sum = UnfusedProduct(y, Mul(N, OC));
    if (sum == nullptr) return;
    Gemm(MatmulForwardGemm(sum, x, w, N, C, OC, GemmOutput::kWrite),
         {.a = CUDA_R_32F, .b = ActivationType(), .c = CUDA_R_32F});
    if (!Begin()) return;
    cuda::AddBiasRows(y, sum, b, N, OC, stream_);
    CheckLaunch("AddBiasRows");
  });
}

void CudaBackend::MatmulBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias,
                                 TensorSpan dout, TensorSpan inp, TensorSpan weight, int N, int C,
                                 int OC) {
  WithStorage(activation_dtype(), [&](auto storage) {
    using S = decltype(storage);
    S* dx = OptionalActivation<S>(dinp, Mul(N, C), "matmul dinp");
    float* dw = CheckedF32(dweight, Mul(OC, C), "matmul dweight");
    float* db = OptionalF32(dbias, OC, "matmul dbias");
    const S* dy = CheckedActivation<const S>(dout, Mul(N, OC), "matmul dout");
    const S* x = CheckedActivation<const S>(inp, Mul(N, C), "matmul inp");
    const float* w = CheckedF32(weight, Mul(OC, C), "matmul weight");
    if (!Begin()) return;
    if (dx != nullptr) {
      // dinp += dout weight: beta 1 reads dinp into the fp32 accumulator,
      // which is rounded once on the store.
      Gemm(MatmulInputGradGemm(dx, dy, w, N, C, OC),
           {.a = CUDA_R_32F, .b = ActivationType(), .c = ActivationType()});
    }
    WeightAndBiasGrad(dw, db, dy, x, N, C, OC);
  });
}

}  // namespace cohort::compute::cuda_impl
