#pragma once
// The cuBLASLt epilogues the CUDA backend fuses into its GEMMs (internal to
// cohort_compute, like cuda_backend_impl.h, which includes it): what each
// computes, what it requires, and the names the backend gives them.
//
// What cublasLt.h (CUDA 13) documents of the epilogues used here, and how
// the backend meets it:
// - BIAS adds the bias vector (length m, packed) to every column before any
//   other postprocessing. GELU_AUX_BIAS adds it, stores that sum (the GELU's
//   input) in the aux matrix, then applies GELU to D; GELU_AUX without the
//   bias. cublasLt.h does not say which GELU: backend.h's is the tanh
//   approximation, and cuBLASLt's is taken to be it too. Unverified until
//   a GPU runs cuda_fused_ops_test, whose fp32 bound (1e-5 relative) the
//   erf GELU (up to 5e-4 away) would fail; should it, the forward must run
//   the unfused kernels (Epilogue::kBias then GeluForward).
// - DGELU multiplies the product by gelu'(aux) and stores it in D;
//   DGELU_BGRAD also stores the row sums of that gradient (length m) in the
//   bias pointer: the bias gradient of the layer whose output aux was.
//   Both are called here with beta = 0 (a write), so whether the gradient
//   applies before or after beta C does not arise.
// - BGRADB stores the sums of op(B) over k (length n) in the bias pointer.
// - The bias-gradient outputs are WRITTEN, not accumulated: the backend's
//   gradients accumulate, so they land in scratch and are added
//   (AccumulateBiasGrad).
// - Types: the bias and bias-gradient vectors are D's type unless set
//   (BIAS_DATA_TYPE), the aux matrix D's type too (EPILOGUE_AUX_DATA_TYPE).
//   Both are set on every plan that uses them: the vectors are parameters
//   or parameter gradients, fp32 in every precision, while D and the aux
//   (the pre-activation, an activation) are bf16 in precision bf16
//   (backend.h, "Activation storage"), where the defaults would take the
//   bias as bf16 too. BGRADB's D is a weight gradient, fp32. Whether a
//   kernel exists for bf16 A/B/D with an fp32 bias is the heuristic's
//   answer: none makes the shape unfused.
// - The aux leading dimension must be a multiple of 8 and at least m; the
//   aux here is laid out like C (ld = ldc), so a C of odd width (the small
//   test models') is unfused by rule, before asking.
// - The heuristic reads the bias and aux pointers' values for their
//   alignment, so they are set before it is asked, and their alignment is
//   part of the plan's key.

#include <cublasLt.h>

#include <cstdint>

namespace cohort::compute::cuda_impl {

// What a GEMM does after its product (cuBLASLt's epilogues, above). The
// vectors are fp32; the aux matrix is an activation (the backend's
// activation dtype), like the D of the GEMMs that use it.
enum class Epilogue : uint8_t {
  kNone,
  kBias,         // D = AB + bias (bias: m floats)
  kGeluAux,      // aux = AB, D = gelu(aux)
  kGeluAuxBias,  // aux = AB + bias, D = gelu(aux)
  kDGelu,        // D = gelu'(aux) * AB
  kDGeluBgrad,   // D = gelu'(aux) * AB, bias = row sums of D (m floats, written)
  kBgradB,       // D as without; bias = sums of op(B) over k (n floats, written)
};

// An epilogue and its operands for one call. The aux matrix is laid out like
// C (m x n, leading dimension ldc).
struct GemmEpilogue {
  Epilogue kind = Epilogue::kNone;
  const float* bias = nullptr;  // kBias, kGeluAuxBias: read; the *grad kinds: written
  void* aux = nullptr;          // kGelu*: written; kDGelu*: read (activation dtype)
};

inline cublasLtEpilogue_t LtEpilogue(Epilogue kind) {
  switch (kind) {
    case Epilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::kDGeluBgrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epilogue::kBgradB:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

inline const char* EpilogueName(Epilogue kind) {
  switch (kind) {
    case Epilogue::kNone:
      return "none";
    case Epilogue::kBias:
      return "BIAS";
    case Epilogue::kGeluAux:
      return "GELU_AUX";
    case Epilogue::kGeluAuxBias:
      return "GELU_AUX_BIAS";
    case Epilogue::kDGelu:
      return "DGELU";
    case Epilogue::kDGeluBgrad:
      return "DGELU_BGRAD";
    case Epilogue::kBgradB:
      return "BGRADB";
  }
  return "unknown";
}

inline bool UsesBias(Epilogue kind) {
  return kind == Epilogue::kBias || kind == Epilogue::kGeluAuxBias ||
         kind == Epilogue::kDGeluBgrad || kind == Epilogue::kBgradB;
}

inline bool UsesAux(Epilogue kind) {
  return kind == Epilogue::kGeluAux || kind == Epilogue::kGeluAuxBias || kind == Epilogue::kDGelu ||
         kind == Epilogue::kDGeluBgrad;
}

}  // namespace cohort::compute::cuda_impl
