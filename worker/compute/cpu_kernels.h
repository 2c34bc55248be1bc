#pragma once
// The fp32 CPU kernels behind CpuBackend, as plain functions over host
// pointers (llm.c style: forward beside backward, shapes in comments). The
// semantics of each are those of the Backend method of the same name
// (worker/compute/backend.h); backward functions accumulate.
//
// Determinism across thread counts: OpenMP loops run only over independent
// outputs. Every reduction (over B*T for bias and LayerNorm weight gradients,
// over channels for LayerNorm statistics, over the vocabulary for the loss
// and the attention softmax) happens inside one loop iteration in an order
// fixed by the code (index order, or the fixed lanes of the vector
// primitives below), so the result does not depend on `threads`. Matrix
// products go through cblas_sgemm, always single-threaded inside OpenBLAS
// (UseSingleThreadedBlas: its threaded driver rounds differently), over
// tiles of the output fixed by the shapes and spread across OpenMP threads.
//
// Thread-safety: the functions are reentrant; calls must not overlap outputs.

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace cohort::compute::cpu {

// Below this many element operations a loop runs on one thread: a fork/join
// costs more than it saves, and far more on a loaded machine, where a
// spinning thread waits for one that is not scheduled.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// The OpenMP team for a loop of `iterations` independent iterations doing
// `work` element operations in total. Never changes a result (iterations
// are independent), only the speed.
inline int TeamSize(int threads, int64_t iterations, int64_t work) {
  if (work < kMinParallelWork) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, iterations)));
}

// Makes OpenBLAS run the calling thread's products on that thread alone.
// Every kernel calls it before its first cblas call. OpenBLAS (Debian's
// pthreads build, which the project links) keeps one thread count for the
// whole process, and its threaded driver rounds differently from its
// single-threaded one on some CPUs (its Haswell and Zen kernels), so a
// product it threads has other bits. The count is set to 1 where it is not,
// and never restored: a count set and restored around each call (as before
// issue 43) let one caller's restore hand another caller's products, in
// flight on another thread of the same process, to the threaded driver.
// Nothing in a Cohort process wants OpenBLAS's own threads: the kernels
// spread products over OpenMP threads in tiles fixed by the shapes.
void UseSingleThreadedBlas();

// ---- cpu_kernels_pointwise.cc ----------------------------------------------
// The encoder over a vocab shard; wpe and dwpe may be null (absent). Backend's
// EncoderForward/Backward are the shard holding every row.
void EncoderForwardShard(float* out, const int32_t* inp, const float* wte, const float* wpe,
                         int vocab_start, int Vs, int B, int T, int C, int threads);
void EncoderBackwardShard(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                          int vocab_start, int Vs, int B, int T, int C, int threads);
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, int threads);
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, int threads);
void GeluForward(float* out, const float* inp, size_t n, int threads);
void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n, int threads);
void ResidualForward(float* out, const float* inp1, const float* inp2, size_t n, int threads);
void ResidualBackward(float* dinp1, float* dinp2, const float* dout, size_t n, int threads);

// ---- cpu_kernels_matmul.cc -------------------------------------------------
// bias and dinp/dbias may be null.
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC, int threads);
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC, int threads);
// dbias (OC) += sum over n of dout[n, :], rows in order: MatmulBackward's bias
// gradient, also the fused MLP backward's (CpuBackend::MatmulGeluBackward).
void AddColumnSums(float* dbias, const float* dout, int N, int OC, int threads);

// ---- cpu_kernels_attention.cc ----------------------------------------------
// att (B,NH,T,T): softmax probabilities, zero above the diagonal.
void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                      int threads);
// scratch: threads * T * T floats.
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att,
                       float* scratch, int B, int T, int C, int NH, int threads);

// ---- cpu_kernels_vector.cc: row primitives (AVX2 + FMA where the CPU has it) ----
// Elementwise results do not depend on where a range is split; sums use a
// fixed lane order. `out` may alias `x`.
// out[i] = gelu(inp[i]) (tanh approximation), i < n.
void GeluForwardSpan(float* out, const float* inp, int64_t n);
// dinp[i] += gelu'(inp[i]) * dout[i], i < n.
void GeluBackwardSpan(float* dinp, const float* inp, const float* dout, int64_t n);
// max_i x[i], n >= 1 (NaNs are skipped).
float MaxOf(const float* x, int64_t n);
// out[i] = exp(x[i] - shift); returns the fp32 sum of the out[i].
float ExpShiftedSum(float* out, const float* x, int64_t n, float shift);
// sum_i exp(x[i] - shift), each term fp32, the sum in double.
double SumExpShifted(const float* x, int64_t n, float shift);
// out[i] = exp(x[i] - shift) * scale.
void ScaledExpShifted(float* out, const float* x, int64_t n, float shift, float scale);

// ---- cpu_kernels_loss.cc ---------------------------------------------------
void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int N, int V, int Vp, int threads);
void CrossEntropyShardMax(float* row_max, const float* logits, int N, int V, int Vs,
                          int vocab_start, int threads);
void CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                           const int32_t* targets, int N, int V, int Vs, int vocab_start,
                           int threads);
void CrossEntropyShardFinish(float* losses, float* lse, const float* row_max, const float* sums,
                             int N, int threads);
// Backend's CrossEntropyBackward is the shard with vocab_start 0, Vs = Vp.
void CrossEntropyShardBackward(float* dlogits, const float* logits, const float* lse,
                               const int32_t* targets, const float* dlosses, int N, int V, int Vs,
                               int vocab_start, int threads);

}  // namespace cohort::compute::cpu
