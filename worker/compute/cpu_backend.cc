#include "worker/compute/cpu_backend.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/compute/cpu_kernels.h"

namespace cohort::compute {
namespace {

constexpr size_t kAlignment = 64;
// Buffers from this size up are mapped directly (see Allocate).
constexpr size_t kMappedBytes = size_t{1} << 20;

// The host pointer behind `span`, after checking that it holds at least
// `min_numel` fp32 elements: an undersized view is a programmer error that
// would otherwise read or write out of bounds.
float* F32(TensorSpan span, size_t min_numel, const char* what) {
  CHECK(span.dtype == DType::kFloat32) << what << ": want float32, got " << DTypeName(span.dtype);
  CHECK(span.data != nullptr) << what << ": empty span";
  CHECK(span.numel >= min_numel) << what << ": " << span.numel << " elements, need " << min_numel;
  return static_cast<float*>(span.data);
}

// Like F32 for optional arguments: nullptr for an empty span.
float* OptionalF32(TensorSpan span, size_t min_numel, const char* what) {
  return span.empty() ? nullptr : F32(span, min_numel, what);
}

const int32_t* I32(TensorSpan span, size_t min_numel, const char* what) {
  CHECK(span.dtype == DType::kInt32) << what << ": want int32, got " << DTypeName(span.dtype);
  CHECK(span.data != nullptr) << what << ": empty span";
  CHECK(span.numel >= min_numel) << what << ": " << span.numel << " elements, need " << min_numel;
  return static_cast<const int32_t*>(span.data);
}

size_t Mul(size_t a, size_t b) { return a * b; }

// A vocab shard: rows (or logit columns) [vocab_start, vocab_start + Vs).
void CheckShard(int vocab_start, int Vs) {
  CHECK(vocab_start >= 0 && Vs > 0) << "vocab shard: vocab_start=" << vocab_start << " Vs=" << Vs;
}

}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : threads_(options.num_threads > 0 ? options.num_threads : omp_get_max_threads()) {}

absl::StatusOr<Buffer> CpuBackend::Allocate(DType dtype, size_t numel) {
  // aligned_alloc wants a multiple of the alignment; never allocate 0 bytes so
  // every buffer has a distinct non-null address.
  const size_t bytes = std::max<size_t>(numel * DTypeSize(dtype), 1);
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded >= kMappedBytes) {
    // Fresh anonymous pages read as zero: no memset here, so each page is
    // zeroed once, by the kernel, when first written (a restore, the first
    // step), instead of twice (weights and gradients are 1 GB for GPT-2
    // 124M). Huge pages where the kernel gives them.
    void* mapped = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (mapped == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot map ", rounded, " bytes of host memory"));
    }
    madvise(mapped, rounded, MADV_HUGEPAGE);  // advice only: fine if refused
    return Buffer(mapped, dtype, numel, [rounded](void* p) { munmap(p, rounded); });
  }
  void* data = std::aligned_alloc(kAlignment, rounded);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", rounded, " bytes of host memory"));
  }
  std::memset(data, 0, rounded);
  return Buffer(data, dtype, numel, [](void* p) { std::free(p); });
}

void CpuBackend::Zero(TensorSpan dst) {
  if (dst.empty()) return;
  // Large buffers (the gradient arena: 500 MB for GPT-2 124M) are cleared
  // by all threads in fixed chunks; one core does not saturate memory.
  constexpr int64_t kChunkBytes = int64_t{1} << 20;
  const int64_t bytes = static_cast<int64_t>(dst.bytes());
  const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  char* base = static_cast<char*>(dst.data);
  const int team = chunks >= 4 ? static_cast<int>(std::min<int64_t>(threads_, chunks)) : 1;
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunkBytes;
    std::memset(base + begin, 0, std::min(kChunkBytes, bytes - begin));
  }
}

void CpuBackend::CopyFromHost(TensorSpan dst, const void* src) {
  if (dst.numel == 0) return;
  std::memcpy(dst.data, src, dst.bytes());
}

void CpuBackend::CopyToHost(void* dst, TensorSpan src) {
  if (src.numel == 0) return;
  std::memcpy(dst, src.data, src.bytes());
}

// The unsharded encoder is the shard that holds the whole table.
void CpuBackend::EncoderForward(TensorSpan out, TensorSpan inp, TensorSpan wte, TensorSpan wpe,
                                int B, int T, int C) {
  CHECK(C > 0 && !wpe.empty()) << "EncoderForward: C=" << C << ", wpe is required";
  EncoderForwardShard(out, inp, wte, wpe, 0, static_cast<int>(wte.numel / C), B, T, C);
}

void CpuBackend::EncoderBackward(TensorSpan dwte, TensorSpan dwpe, TensorSpan dout, TensorSpan inp,
                                 int B, int T, int C) {
  CHECK(C > 0 && !dwpe.empty()) << "EncoderBackward: C=" << C << ", dwpe is required";
  EncoderBackwardShard(dwte, dwpe, dout, inp, 0, static_cast<int>(dwte.numel / C), B, T, C);
}

void CpuBackend::LayerNormForward(TensorSpan out, TensorSpan mean, TensorSpan rstd, TensorSpan inp,
                                  TensorSpan weight, TensorSpan bias, int N, int C) {
  const size_t nc = Mul(N, C);
  cpu::LayerNormForward(F32(out, nc, "ln out"), F32(mean, N, "ln mean"), F32(rstd, N, "ln rstd"),
                        F32(inp, nc, "ln inp"), F32(weight, C, "ln weight"),
                        F32(bias, C, "ln bias"), N, C, threads_);
}

void CpuBackend::LayerNormBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias,
                                   TensorSpan dout, TensorSpan inp, TensorSpan weight,
                                   TensorSpan mean, TensorSpan rstd, int N, int C) {
  const size_t nc = Mul(N, C);
  cpu::LayerNormBackward(F32(dinp, nc, "ln dinp"), F32(dweight, C, "ln dweight"),
                         F32(dbias, C, "ln dbias"), F32(dout, nc, "ln dout"),
                         F32(inp, nc, "ln inp"), F32(weight, C, "ln weight"),
                         F32(mean, N, "ln mean"), F32(rstd, N, "ln rstd"), N, C, threads_);
}

void CpuBackend::MatmulForward(TensorSpan out, TensorSpan inp, TensorSpan weight, TensorSpan bias,
                               int N, int C, int OC) {
  cpu::MatmulForward(F32(out, Mul(N, OC), "matmul out"), F32(inp, Mul(N, C), "matmul inp"),
                     F32(weight, Mul(OC, C), "matmul weight"), OptionalF32(bias, OC, "bias"), N, C,
                     OC, threads_);
}

void CpuBackend::MatmulBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias,
                                TensorSpan dout, TensorSpan inp, TensorSpan weight, int N, int C,
                                int OC) {
  cpu::MatmulBackward(OptionalF32(dinp, Mul(N, C), "matmul dinp"),
                      F32(dweight, Mul(OC, C), "matmul dweight"),
                      OptionalF32(dbias, OC, "matmul dbias"), F32(dout, Mul(N, OC), "matmul dout"),
                      F32(inp, Mul(N, C), "matmul inp"), F32(weight, Mul(OC, C), "matmul weight"),
                      N, C, OC, threads_);
}

size_t CpuBackend::AttentionStateNumel(int B, int T, int NH) const {
  return Mul(Mul(B, NH), Mul(T, T));
}

void CpuBackend::AttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B, int T,
                                  int C, int NH) {
  CHECK(NH > 0 && C % NH == 0) << "C=" << C << " not divisible by NH=" << NH;
  const size_t bt = Mul(B, T);
  cpu::AttentionForward(F32(out, bt * C, "attention out"),
                        F32(state, AttentionStateNumel(B, T, NH), "attention state"),
                        F32(qkv, bt * 3 * C, "qkv"), B, T, C, NH, threads_);
}

void CpuBackend::AttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv,
                                   TensorSpan state, int B, int T, int C, int NH) {
  CHECK(NH > 0 && C % NH == 0) << "C=" << C << " not divisible by NH=" << NH;
  const size_t bt = Mul(B, T);
  const size_t scratch = Mul(threads_, Mul(T, T));
  if (attention_scratch_.size() < scratch) attention_scratch_.resize(scratch);
  cpu::AttentionBackward(F32(dqkv, bt * 3 * C, "dqkv"), F32(dout, bt * C, "attention dout"),
                         F32(qkv, bt * 3 * C, "qkv"),
                         F32(state, AttentionStateNumel(B, T, NH), "attention state"),
                         attention_scratch_.data(), B, T, C, NH, threads_);
}

void CpuBackend::GeluForward(TensorSpan out, TensorSpan inp, size_t n) {
  cpu::GeluForward(F32(out, n, "gelu out"), F32(inp, n, "gelu inp"), n, threads_);
}

void CpuBackend::GeluBackward(TensorSpan dinp, TensorSpan inp, TensorSpan dout, size_t n) {
  cpu::GeluBackward(F32(dinp, n, "gelu dinp"), F32(inp, n, "gelu inp"), F32(dout, n, "gelu dout"),
                    n, threads_);
}

void CpuBackend::ResidualForward(TensorSpan out, TensorSpan inp1, TensorSpan inp2, size_t n) {
  cpu::ResidualForward(F32(out, n, "residual out"), F32(inp1, n, "residual inp1"),
                       F32(inp2, n, "residual inp2"), n, threads_);
}

void CpuBackend::ResidualBackward(TensorSpan dinp1, TensorSpan dinp2, TensorSpan dout, size_t n) {
  cpu::ResidualBackward(F32(dinp1, n, "residual dinp1"), F32(dinp2, n, "residual dinp2"),
                        F32(dout, n, "residual dout"), n, threads_);
}

void CpuBackend::CrossEntropyForward(TensorSpan losses, TensorSpan lse, TensorSpan logits,
                                     TensorSpan targets, int N, int V, int Vp) {
  CHECK(V > 0 && V <= Vp) << "V=" << V << " Vp=" << Vp;
  cpu::CrossEntropyForward(F32(losses, N, "losses"), F32(lse, N, "lse"),
                           F32(logits, Mul(N, Vp), "logits"), I32(targets, N, "targets"), N, V, Vp,
                           threads_);
}

void CpuBackend::CrossEntropyBackward(TensorSpan dlogits, TensorSpan logits, TensorSpan lse,
                                      TensorSpan targets, TensorSpan dlosses, int N, int V,
                                      int Vp) {
  CHECK(V > 0 && V <= Vp) << "V=" << V << " Vp=" << Vp;
  CrossEntropyShardBackward(dlogits, logits, lse, targets, dlosses, N, V, Vp, 0);
}

void CpuBackend::EncoderForwardShard(TensorSpan out, TensorSpan inp, TensorSpan wte, TensorSpan wpe,
                                     int vocab_start, int Vs, int B, int T, int C) {
  CheckShard(vocab_start, Vs);
  const size_t bt = Mul(B, T);
  cpu::EncoderForwardShard(F32(out, bt * C, "encoder out"), I32(inp, bt, "encoder inp"),
                           F32(wte, Mul(Vs, C), "wte"), OptionalF32(wpe, Mul(T, C), "wpe"),
                           vocab_start, Vs, B, T, C, threads_);
}

void CpuBackend::EncoderBackwardShard(TensorSpan dwte, TensorSpan dwpe, TensorSpan dout,
                                      TensorSpan inp, int vocab_start, int Vs, int B, int T,
                                      int C) {
  CheckShard(vocab_start, Vs);
  const size_t bt = Mul(B, T);
  cpu::EncoderBackwardShard(F32(dwte, Mul(Vs, C), "dwte"), OptionalF32(dwpe, Mul(T, C), "dwpe"),
                            F32(dout, bt * C, "encoder dout"), I32(inp, bt, "encoder inp"),
                            vocab_start, Vs, B, T, C, threads_);
}

void CpuBackend::CrossEntropyShardMax(TensorSpan row_max, TensorSpan logits, int N, int V, int Vs,
                                      int vocab_start) {
  CheckShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  cpu::CrossEntropyShardMax(F32(row_max, N, "row_max"), F32(logits, Mul(N, Vs), "logits"), N, V, Vs,
                            vocab_start, threads_);
}

void CpuBackend::CrossEntropyShardSums(TensorSpan sums, TensorSpan logits, TensorSpan row_max,
                                       TensorSpan targets, int N, int V, int Vs, int vocab_start) {
  CheckShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  cpu::CrossEntropyShardSums(F32(sums, Mul(2, N), "sums"), F32(logits, Mul(N, Vs), "logits"),
                             F32(row_max, N, "row_max"), I32(targets, N, "targets"), N, V, Vs,
                             vocab_start, threads_);
}

void CpuBackend::CrossEntropyShardFinish(TensorSpan losses, TensorSpan lse, TensorSpan row_max,
                                         TensorSpan sums, int N) {
  cpu::CrossEntropyShardFinish(F32(losses, N, "losses"), F32(lse, N, "lse"),
                               F32(row_max, N, "row_max"), F32(sums, Mul(2, N), "sums"), N,
                               threads_);
}

void CpuBackend::CrossEntropyShardBackward(TensorSpan dlogits, TensorSpan logits, TensorSpan lse,
                                           TensorSpan targets, TensorSpan dlosses, int N, int V,
                                           int Vs, int vocab_start) {
  CheckShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  CHECK(dlogits.data != logits.data) << "dlogits may not alias logits";
  cpu::CrossEntropyShardBackward(
      F32(dlogits, Mul(N, Vs), "dlogits"), F32(logits, Mul(N, Vs), "logits"), F32(lse, N, "lse"),
      I32(targets, N, "targets"), F32(dlosses, N, "dlosses"), N, V, Vs, vocab_start, threads_);
}

}  // namespace cohort::compute
