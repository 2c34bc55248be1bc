// Naive causal multi-head attention that materialises att (B,NH,T,T), like
// llm.c's CPU attention, but with the score and value products done by
// cblas_sgemm per (batch, head). OpenMP runs over the B*NH independent
// (batch, head) pairs; inside, each sgemm runs single-threaded
// (UseSingleThreadedBlas) and each softmax row
// is reduced by one thread (the forward's with the vector primitives of
// cpu_kernels_vector.cc, the backward's serially).

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "worker/compute/cpu_kernels.h"
#include "worker/compute/kernel_math.h"

namespace cohort::compute::cpu {
namespace {

// The causal bound and the softmax backward's row math are the CUDA kernels'
// too (kernel_math.h); the forward's max and exponentials are this backend's
// vector primitives.
using kernel_math::CausalColumns;
using kernel_math::SoftmaxInputGrad;
using kernel_math::StridedDot;

}  // namespace

void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                      int threads) {
  // qkv (B,T,3C) -> out (B,T,C), att (B,NH,T,T)
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int pairs = B * NH;
  UseSingleThreadedBlas();
  const int team = TeamSize(threads, pairs, int64_t{pairs} * T * T * hs);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int bh = 0; bh < pairs; ++bh) {
    const int b = bh / NH;
    const int h = bh % NH;
    const float* q = qkv + static_cast<int64_t>(b) * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + static_cast<int64_t>(bh) * T * T;
    // a (T,T) = scale * q (T,hs) k^T; the part above the diagonal is masked below.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
    for (int t = 0; t < T; ++t) {
      float* row = a + static_cast<int64_t>(t) * T;
      const int valid = CausalColumns(t, T);
      const float maxval = MaxOf(row, valid);
      const float inv = 1.0f / ExpShiftedSum(row, row, valid, maxval);
      for (int t2 = 0; t2 < valid; ++t2) row[t2] *= inv;
      for (int t2 = valid; t2 < T; ++t2) row[t2] = 0.0f;
    }
    // out_bh (T,hs) = a (T,T) v (T,hs); the zeros above the diagonal add nothing.
    float* o = out + static_cast<int64_t>(b) * T * C + h * hs;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3, 0.0f, o, C);
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att,
                       float* scratch, int B, int T, int C, int NH, int threads) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int pairs = B * NH;
  UseSingleThreadedBlas();
  const int team = TeamSize(threads, pairs, int64_t{pairs} * T * T * hs);
#pragma omp parallel num_threads(team)
  {
    // Scratch is per OpenMP thread; which thread handles a pair does not
    // change any result.
    float* datt = scratch + static_cast<int64_t>(omp_get_thread_num()) * T * T;
#pragma omp for schedule(static)
    for (int bh = 0; bh < pairs; ++bh) {
      const int b = bh / NH;
      const int h = bh % NH;
      const int64_t base = static_cast<int64_t>(b) * T * C3 + h * hs;
      const float* q = qkv + base;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + base;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + static_cast<int64_t>(bh) * T * T;
      const float* dy = dout + static_cast<int64_t>(b) * T * C + h * hs;
      // datt (T,T) = dy (T,hs) v^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, C, v, C3, 0.0f, datt,
                  T);
      // dv (T,hs) += a^T (T,T) dy (T,hs)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dy, C, 1.0f, dv,
                  C3);
      // Softmax backward in place: dpre[t2] = a[t2] * (datt[t2] - sum_j a[j] datt[j]).
      for (int t = 0; t < T; ++t) {
        const float* arow = a + static_cast<int64_t>(t) * T;
        float* drow = datt + static_cast<int64_t>(t) * T;
        const int valid = CausalColumns(t, T);
        const float dot = StridedDot(arow, drow, valid, 0, 1);
        for (int t2 = 0; t2 < valid; ++t2) drow[t2] = SoftmaxInputGrad(arow[t2], drow[t2], dot);
        for (int t2 = valid; t2 < T; ++t2) drow[t2] = 0.0f;
      }
      // dq (T,hs) += scale * dpre (T,T) k (T,hs);  dk (T,hs) += scale * dpre^T q.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, datt, T, k, C3, 1.0f,
                  dq, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, datt, T, q, C3, 1.0f,
                  dk, C3);
    }
  }
}

}  // namespace cohort::compute::cpu
