// Linear layer kernels: cblas_sgemm for the products, OpenMP for the bias.
//
// OpenBLAS's own threading does not keep results independent of its thread
// count (its threaded driver blocks the products differently from the
// single-threaded one), so every product here runs as fixed blocks of
// kGemmRowBlock output rows, each a single-threaded sgemm, with OpenMP over
// the blocks. Block boundaries depend only on the shapes, never on `threads`.

#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "worker/compute/cpu_kernels.h"

namespace cohort::compute::cpu {
namespace {

// dbias is a reduction over rows: threads own blocks of output channels.
constexpr int kChannelBlock = 16;
// Output rows per sgemm call. Large enough that repacking the shared operand
// per block costs little, small enough to split B*T = 256 rows in two.
constexpr int kGemmRowBlock = 128;

// C (M,N) = alpha op(A) (M,K) op(B) (K,N) + beta C, row-major, in fixed
// blocks of output rows. op(A) = A (lda >= K) or A^T with A stored (K,M).
void BlockedSgemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K,
                  float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                  float* C, int ldc, int threads) {
  const int blocks = (M + kGemmRowBlock - 1) / kGemmRowBlock;
  ScopedBlasThreads blas(1);
  const int team = TeamSize(threads, blocks, int64_t{M} * N * K);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int m0 = blk * kGemmRowBlock;
    const int rows = std::min(M, m0 + kGemmRowBlock) - m0;
    // Rows m0.. of op(A): rows of A, or columns of A when transposed.
    const float* a = trans_a == CblasNoTrans ? A + static_cast<int64_t>(m0) * lda : A + m0;
    cblas_sgemm(CblasRowMajor, trans_a, trans_b, rows, N, K, alpha, a, lda, B, ldb, beta,
                C + static_cast<int64_t>(m0) * ldc, ldc);
  }
}

}  // namespace

ScopedBlasThreads::ScopedBlasThreads(int threads) : previous_(openblas_get_num_threads()) {
  if (previous_ != threads) openblas_set_num_threads(threads);
}

ScopedBlasThreads::~ScopedBlasThreads() {
  if (openblas_get_num_threads() != previous_) openblas_set_num_threads(previous_);
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC, int threads) {
  // out (N,OC) = inp (N,C) * weight (OC,C)^T + bias (OC)
  float beta = 0.0f;
  if (bias != nullptr) {
    // Start from the bias and let sgemm add the product (beta = 1), as
    // torch.addmm does.
    const int team = TeamSize(threads, N, int64_t{N} * OC);
#pragma omp parallel for num_threads(team) schedule(static)
    for (int n = 0; n < N; ++n) {
      std::copy(bias, bias + OC, out + static_cast<int64_t>(n) * OC);
    }
    beta = 1.0f;
  }
  BlockedSgemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC, threads);
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC, int threads) {
  // dinp (N,C) += dout (N,OC) * weight (OC,C)
  if (dinp != nullptr) {
    BlockedSgemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C,
                 threads);
  }
  // dweight (OC,C) += dout^T (OC,N) * inp (N,C)
  BlockedSgemm(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C,
               threads);
  if (dbias == nullptr) return;
  // dbias (OC) += sum over n of dout[n, :], rows in order.
  const int blocks = (OC + kChannelBlock - 1) / kChannelBlock;
  const int team = TeamSize(threads, blocks, int64_t{N} * OC);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int o0 = blk * kChannelBlock;
    const int width = std::min(OC, o0 + kChannelBlock) - o0;
    float acc[kChannelBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* dy = dout + static_cast<int64_t>(n) * OC + o0;
      for (int j = 0; j < width; ++j) acc[j] += dy[j];
    }
    for (int j = 0; j < width; ++j) dbias[o0 + j] += acc[j];
  }
}

}  // namespace cohort::compute::cpu
