#include "worker/compute/gemm_shapes.h"

#include <string_view>

#include "absl/strings/str_cat.h"

namespace cohort::compute {
namespace {

float Beta(GemmOutput output) { return output == GemmOutput::kAccumulate ? 1.0f : 0.0f; }

// What one head's share of an operand is: a (T,hs) head or a (T,T) block.
enum class PerHeadPart { kHead, kBlock };

// One GEMM per head over packed heads: `shape` with the batch and strides
// filled in, each operand advancing by its part from one head to the next.
GemmCall PerHead(GemmShape shape, PerHeadPart a_part, PerHeadPart b_part, PerHeadPart c_part,
                 float alpha, const void* a, const void* b, void* c, const HeadBatch& heads) {
  auto stride = [&heads](PerHeadPart part) {
    return part == PerHeadPart::kBlock ? int64_t{heads.T} * heads.T : int64_t{heads.T} * heads.hs;
  };
  shape.batch = heads.count;
  shape.stride_a = stride(a_part);
  shape.stride_b = stride(b_part);
  shape.stride_c = stride(c_part);
  return GemmCall{.shape = shape, .alpha = alpha, .beta = 0.0f, .a = a, .b = b, .c = c};
}

// Per head, out (T,T) = alpha x (T,hs) y^T. Column-major that is
// out^T (T,T) = alpha y x^T, with y and x each stored as an (hs,T) matrix
// of leading dimension hs: A = y transposed, B = x as stored.
GemmCall HeadScores(void* out, const void* x, const void* y, float alpha, const HeadBatch& heads) {
  const int T = heads.T, hs = heads.hs;
  return PerHead({.transa = true, .m = T, .n = T, .k = hs, .lda = hs, .ldb = hs, .ldc = T},
                 PerHeadPart::kHead, PerHeadPart::kHead, PerHeadPart::kBlock, alpha, y, x, out,
                 heads);
}

// Per head, out (T,hs) = alpha p (T,T) x (T,hs), or alpha p^T x with
// transpose_p. Column-major: out^T (hs,T) = alpha x^T p^T, where the stored
// x is x^T (hs,T) and the stored p is p^T (T,T); p itself is its transpose.
GemmCall HeadsMix(void* out, const void* p, bool transpose_p, const void* x, float alpha,
                  const HeadBatch& heads) {
  const int T = heads.T, hs = heads.hs;
  return PerHead({.transb = transpose_p, .m = hs, .n = T, .k = T, .lda = hs, .ldb = T, .ldc = hs},
                 PerHeadPart::kHead, PerHeadPart::kBlock, PerHeadPart::kHead, alpha, x, p, out,
                 heads);
}

}  // namespace

// out^T (OC,N) = weight (OC,C) inp^T (C,N): the stored weight is its
// transpose (C,OC), the stored inp is inp^T.
GemmCall MatmulForwardGemm(void* out, const void* inp, const void* weight, int N, int C, int OC,
                           GemmOutput output) {
  return GemmCall{
      .shape =
          {.transa = true, .transb = false, .m = OC, .n = N, .k = C, .lda = C, .ldb = C, .ldc = OC},
      .alpha = 1.0f,
      .beta = Beta(output),
      .a = weight,
      .b = inp,
      .c = out};
}

// dinp^T (C,N) += weight^T (C,OC) dout^T (OC,N): both as stored.
GemmCall MatmulInputGradGemm(void* dinp, const void* dout, const void* weight, int N, int C,
                             int OC) {
  return GemmCall{.shape = {.transa = false,
                            .transb = false,
                            .m = C,
                            .n = N,
                            .k = OC,
                            .lda = C,
                            .ldb = OC,
                            .ldc = C},
                  .alpha = 1.0f,
                  .beta = 1.0f,
                  .a = weight,
                  .b = dout,
                  .c = dinp};
}

// dweight^T (C,OC) += inp^T (C,N) dout (N,OC): inp as stored, the stored
// dout^T (OC,N) transposed.
GemmCall MatmulWeightGradGemm(void* dweight, const void* dout, const void* inp, int N, int C,
                              int OC) {
  return GemmCall{
      .shape =
          {.transa = false, .transb = true, .m = C, .n = OC, .k = N, .lda = C, .ldb = OC, .ldc = C},
      .alpha = 1.0f,
      .beta = 1.0f,
      .a = inp,
      .b = dout,
      .c = dweight};
}

GemmCall AttentionScoresGemm(void* scores, const void* q, const void* k, float scale,
                             const HeadBatch& heads) {
  return HeadScores(scores, q, k, scale, heads);
}

GemmCall AttentionOutputGemm(void* out, const void* att, const void* v, const HeadBatch& heads) {
  return HeadsMix(out, att, /*transpose_p=*/false, v, 1.0f, heads);
}

GemmCall AttentionProbsGradGemm(void* datt, const void* dout, const void* v,
                                const HeadBatch& heads) {
  return HeadScores(datt, dout, v, 1.0f, heads);
}

GemmCall AttentionValueGradGemm(void* dv, const void* att, const void* dout,
                                const HeadBatch& heads) {
  return HeadsMix(dv, att, /*transpose_p=*/true, dout, 1.0f, heads);
}

GemmCall AttentionQueryGradGemm(void* dq, const void* dscores, const void* k, float scale,
                                const HeadBatch& heads) {
  return HeadsMix(dq, dscores, /*transpose_p=*/false, k, scale, heads);
}

GemmCall AttentionKeyGradGemm(void* dk, const void* dscores, const void* q, float scale,
                              const HeadBatch& heads) {
  return HeadsMix(dk, dscores, /*transpose_p=*/true, q, scale, heads);
}

absl::Status CheckTf32Override(Precision precision, const char* tf32_override) {
  if (precision != Precision::kTf32 || tf32_override == nullptr ||
      std::string_view(tf32_override) == "1") {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "precision tf32 asks cuBLAS for TF32 tensor-core products, but NVIDIA_TF32_OVERRIDE=\"",
      tf32_override,
      "\" may make NVIDIA's libraries compute them in full fp32 instead, silently changing every "
      "GEMM's results; unset NVIDIA_TF32_OVERRIDE or ask for precision fp32"));
}

}  // namespace cohort::compute
