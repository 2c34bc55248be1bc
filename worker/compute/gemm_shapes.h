#pragma once
// The GEMMs the CUDA backend issues, each built from the row-major shapes
// backend.h documents into what a column-major BLAS (cuBLAS, cuBLASLt) is
// handed: transposes, m/n/k, leading dimensions, batch count and strides,
// the operands in the order the library takes them, alpha and beta. Plain
// host code, no CUDA, so that every builder runs on the CPU through
// cblas_sgemm in column-major form (tests/unit/compute/gemm_shapes_test.cc):
// a wrong transpose, leading dimension or stride fails a test here instead
// of a step on a GPU.
//
// Row-major to column-major: a row-major (R,K) array is, to a column-major
// library, the (K,R) matrix X^T with leading dimension K. So a row-major
// product Y = X W becomes Y^T = W^T X^T: the operands swap places and each
// transpose is read off the stored shapes (the comments give each GEMM in
// row-major terms, as backend.h does).
//
// Also here: the check of the environment against the precision the
// backend's GEMMs are asked for (CheckTf32Override), so that its test runs
// on the CPU too.
//
// Thread-safety: plain functions and data.

#include <cstdint>

#include "absl/status/status.h"
#include "worker/compute/backend_factory.h"

namespace cohort::compute {

// C_i (m x n) = alpha op(A_i) op(B_i) + beta C_i for i < batch, column-major,
// with X_i = X + i * stride_x; op(A) (m x k) is A or A^T by transa, op(B)
// (k x n) likewise by transb.
struct GemmShape {
  bool transa = false;
  bool transb = false;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;

  // The stored (not transposed) shapes of A and B, column-major: what a
  // leading dimension must cover (lda >= a_rows()) and what bf16 rounding
  // copies.
  int a_rows() const { return transa ? k : m; }
  int a_cols() const { return transa ? m : k; }
  int b_rows() const { return transb ? n : k; }
  int b_cols() const { return transb ? k : n; }
};

// One GEMM of a backend op: its shape, scalars and operands (device memory
// on a GPU, host memory in the tests).
struct GemmCall {
  GemmShape shape;
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
};

// Whether a GEMM overwrites its output (beta 0) or adds to it (beta 1).
enum class GemmOutput { kWrite, kAccumulate };

// ---- Linear (backend.h: weight (OC,C), y = x W^T + b) -------------------------

// MatmulForward: out (N,OC) = inp (N,C) weight^T, plus out with kAccumulate
// (which the CUDA backend uses when out already holds the broadcast bias).
GemmCall MatmulForwardGemm(void* out, const void* inp, const void* weight, int N, int C, int OC,
                           GemmOutput output);
// MatmulBackward's input gradient: dinp (N,C) += dout (N,OC) weight (OC,C).
GemmCall MatmulInputGradGemm(void* dinp, const void* dout, const void* weight, int N, int C,
                             int OC);
// MatmulBackward's weight gradient: dweight (OC,C) += dout^T (OC,N) inp (N,C).
GemmCall MatmulWeightGradGemm(void* dweight, const void* dout, const void* inp, int N, int C,
                              int OC);

// ---- Attention's products ------------------------------------------------------
// Over `count` heads stored one after another (B*NH of them: the CUDA
// backend's head-major copies, (B,NH,T,hs)): each head a row-major (T,hs)
// array, each score or probability block a row-major (T,T) one. Every
// product writes its output (the backend adds dq, dk, dv into dqkv itself).
struct HeadBatch {
  int count = 0;  // heads
  int T = 0;      // sequence length
  int hs = 0;     // head size
};

// Forward scores: scores (T,T) = scale q (T,hs) k^T.
GemmCall AttentionScoresGemm(void* scores, const void* q, const void* k, float scale,
                             const HeadBatch& heads);
// Forward output: out (T,hs) = att (T,T) v (T,hs).
GemmCall AttentionOutputGemm(void* out, const void* att, const void* v, const HeadBatch& heads);
// Backward, the probabilities' gradient: datt (T,T) = dout (T,hs) v^T.
GemmCall AttentionProbsGradGemm(void* datt, const void* dout, const void* v,
                                const HeadBatch& heads);
// Backward, v's gradient: dv (T,hs) = att^T (T,T) dout (T,hs).
GemmCall AttentionValueGradGemm(void* dv, const void* att, const void* dout,
                                const HeadBatch& heads);
// Backward, q's gradient: dq (T,hs) = scale dscores (T,T) k (T,hs), with
// dscores the gradient of the scaled scores (the softmax's backward of datt).
GemmCall AttentionQueryGradGemm(void* dq, const void* dscores, const void* k, float scale,
                                const HeadBatch& heads);
// Backward, k's gradient: dk (T,hs) = scale dscores^T (T,T) q (T,hs).
GemmCall AttentionKeyGradGemm(void* dk, const void* dscores, const void* q, float scale,
                              const HeadBatch& heads);

// ---- Math ---------------------------------------------------------------------
// NVIDIA_TF32_OVERRIDE=0 tells NVIDIA's libraries to compute in full fp32
// what a program asked to compute in TF32, overriding the program's own
// choice: under it, precision tf32 would silently give fp32's results (and
// speed), unlike the same job elsewhere. The variable's value is
// `tf32_override`, null when unset. FailedPrecondition naming the variable
// when `precision` is tf32 and the value is anything but "1" (whatever 1
// means to a library, TF32 is what was asked for); OK otherwise.
// fp32 needs no such check: its GEMMs are pedantic (cuda_backend.h), which
// no value of the variable turns into TF32; bf16 operands are not fp32, so
// TF32 does not apply to them.
absl::Status CheckTf32Override(Precision precision, const char* tf32_override);

}  // namespace cohort::compute
