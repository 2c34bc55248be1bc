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
#include "worker/compute/span_checks.h"

namespace cohort::compute {
namespace {

constexpr size_t kAlignment = 64;
// Buffers from this size up are mapped directly (see Allocate).
constexpr size_t kMappedBytes = size_t{1} << 20;

size_t Mul(size_t a, size_t b) { return a * b; }

}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : threads_(options.num_threads > 0 ? options.num_threads : omp_get_max_threads()),
      activation_dtype_(options.activation_dtype) {
  CHECK(activation_dtype_ == DType::kFloat32 || activation_dtype_ == DType::kBFloat16)
      << "CpuBackend stores activations in float32 or bfloat16, not "
      << DTypeName(activation_dtype_);
}

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

absl::Status CpuBackend::ReserveScratch(const PassShape& shape) {
  // AttentionBackward's per-thread score rows.
  const size_t scratch = Mul(threads_, Mul(shape.max_seq, shape.max_seq));
  if (attention_scratch_.size() < scratch) attention_scratch_.resize(scratch);
  // MatmulGeluBackward's (N, 4C/tp): the widest biased matmul's output.
  const size_t gelu = Mul(Mul(shape.max_batch, shape.max_seq), shape.max_bias_columns);
  if (gelu_grad_scratch_.size() < gelu) gelu_grad_scratch_.resize(gelu);
  return absl::OkStatus();
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

// Every op below reaches its activation spans through a staging (act): with
// fp32 activations their own memory, with bf16 ones fp32 copies rounded
// back when the op ends (cpu_activation_staging.h). Parameters, their
// gradients and the statistics are fp32 spans, used in place.

void CpuBackend::LayerNormForward(TensorSpan out, TensorSpan mean, TensorSpan rstd, TensorSpan inp,
                                  TensorSpan weight, TensorSpan bias, int N, int C) {
  const size_t nc = Mul(N, C);
  cpu::ActivationStaging act = StageActivations();
  cpu::LayerNormForward(act.Out(out, nc, "ln out"), CheckedF32(mean, N, "ln mean"),
                        CheckedF32(rstd, N, "ln rstd"), act.In(inp, nc, "ln inp"),
                        CheckedF32(weight, C, "ln weight"), CheckedF32(bias, C, "ln bias"), N, C,
                        threads_);
}

void CpuBackend::LayerNormBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias,
                                   TensorSpan dout, TensorSpan inp, TensorSpan weight,
                                   TensorSpan mean, TensorSpan rstd, int N, int C) {
  const size_t nc = Mul(N, C);
  cpu::ActivationStaging act = StageActivations();
  cpu::LayerNormBackward(act.Out(dinp, nc, "ln dinp"), CheckedF32(dweight, C, "ln dweight"),
                         CheckedF32(dbias, C, "ln dbias"), act.In(dout, nc, "ln dout"),
                         act.In(inp, nc, "ln inp"), CheckedF32(weight, C, "ln weight"),
                         CheckedF32(mean, N, "ln mean"), CheckedF32(rstd, N, "ln rstd"), N, C,
                         threads_);
}

void CpuBackend::ResidualLayerNormForward(TensorSpan residual_out, TensorSpan out, TensorSpan mean,
                                          TensorSpan rstd, TensorSpan inp1, TensorSpan inp2,
                                          TensorSpan weight, TensorSpan bias, int N, int C) {
  CheckNotAnInput(residual_out, {inp1, inp2}, "ResidualLayerNormForward: residual_out");
  const size_t nc = Mul(N, C);
  cpu::ActivationStaging act = StageActivations();
  float* residual = act.Out(residual_out, nc, "residual-ln residual_out");
  // The default's order (ResidualForward, then LayerNormForward of its sum).
  cpu::ResidualForward(residual, act.In(inp1, nc, "residual-ln inp1"),
                       act.In(inp2, nc, "residual-ln inp2"), nc, threads_);
  cpu::LayerNormForward(act.Out(out, nc, "residual-ln out"), CheckedF32(mean, N, "ln mean"),
                        CheckedF32(rstd, N, "ln rstd"), residual,
                        CheckedF32(weight, C, "ln weight"), CheckedF32(bias, C, "ln bias"), N, C,
                        threads_);
}

void CpuBackend::MatmulForward(TensorSpan out, TensorSpan inp, TensorSpan weight, TensorSpan bias,
                               int N, int C, int OC) {
  cpu::ActivationStaging act = StageActivations();
  cpu::MatmulForward(act.Out(out, Mul(N, OC), "matmul out"), act.In(inp, Mul(N, C), "matmul inp"),
                     CheckedF32(weight, Mul(OC, C), "matmul weight"), OptionalF32(bias, OC, "bias"),
                     N, C, OC, threads_);
}

void CpuBackend::MatmulGeluForward(TensorSpan out, TensorSpan pre, TensorSpan inp,
                                   TensorSpan weight, TensorSpan bias, int N, int C, int OC) {
  const size_t noc = Mul(N, OC);
  cpu::ActivationStaging act = StageActivations();
  // The default's order (MatmulForward into pre, then GeluForward of pre).
  float* p = act.Out(pre, noc, "matmul-gelu pre");
  cpu::MatmulForward(p, act.In(inp, Mul(N, C), "matmul-gelu inp"),
                     CheckedF32(weight, Mul(OC, C), "matmul-gelu weight"),
                     OptionalF32(bias, OC, "matmul-gelu bias"), N, C, OC, threads_);
  cpu::GeluForward(act.Out(out, noc, "matmul-gelu out"), p, noc, threads_);
}

void CpuBackend::MatmulBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias,
                                TensorSpan dout, TensorSpan inp, TensorSpan weight, int N, int C,
                                int OC) {
  cpu::ActivationStaging act = StageActivations();
  cpu::MatmulBackward(
      act.OptionalOut(dinp, Mul(N, C), "matmul dinp"),
      CheckedF32(dweight, Mul(OC, C), "matmul dweight"), OptionalF32(dbias, OC, "matmul dbias"),
      act.In(dout, Mul(N, OC), "matmul dout"), act.In(inp, Mul(N, C), "matmul inp"),
      CheckedF32(weight, Mul(OC, C), "matmul weight"), N, C, OC, threads_);
}

void CpuBackend::MatmulGeluBackward(TensorSpan dpre, TensorSpan dpre_bias, TensorSpan dweight,
                                    TensorSpan dbias, TensorSpan dout, TensorSpan act,
                                    TensorSpan pre, TensorSpan weight, int N, int C, int OC) {
  const size_t nc = Mul(N, C);
  CheckNotAnInput(dpre, {act, pre, dout}, "MatmulGeluBackward: dpre");
  cpu::ActivationStaging staged = StageActivations();
  float* dp = staged.Out(dpre, nc, "matmul-gelu dpre");
  float* dpb = OptionalF32(dpre_bias, C, "matmul-gelu dpre_bias");
  const float* p = staged.In(pre, nc, "matmul-gelu pre");
  // Exactly the unfused sequence's operations, in its order: the GELU's
  // output gradient accumulated into zeros, then GELU's backward accumulated
  // into a zeroed dpre (0 + x, which turns -0 into +0 as it always did), then
  // the column sums MatmulBackward would take of dpre. The GELU's output
  // gradient is never stored, so it stays fp32 in any activation dtype.
  if (gelu_grad_scratch_.size() < nc) gelu_grad_scratch_.resize(nc);
  float* dact = gelu_grad_scratch_.data();
  std::fill_n(dact, nc, 0.0f);
  cpu::MatmulBackward(dact, CheckedF32(dweight, Mul(OC, C), "matmul-gelu dweight"),
                      OptionalF32(dbias, OC, "matmul-gelu dbias"),
                      staged.In(dout, Mul(N, OC), "matmul-gelu dout"),
                      staged.In(act, nc, "matmul-gelu act"),
                      CheckedF32(weight, Mul(OC, C), "matmul-gelu weight"), N, C, OC, threads_);
  std::fill_n(dp, nc, 0.0f);
  cpu::GeluBackward(dp, p, dact, nc, threads_);
  if (dpb != nullptr) cpu::AddColumnSums(dpb, dp, N, C, threads_);
}

size_t CpuBackend::AttentionStateNumel(int B, int T, int /*C*/, int NH) const {
  return Mul(Mul(B, NH), Mul(T, T));
}

void CpuBackend::AttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B, int T,
                                  int C, int NH) {
  CHECK(NH > 0 && C % NH == 0) << "C=" << C << " not divisible by NH=" << NH;
  const size_t bt = Mul(B, T);
  cpu::ActivationStaging act = StageActivations();
  cpu::AttentionForward(act.Out(out, bt * C, "attention out"),
                        CheckedF32(state, AttentionStateNumel(B, T, C, NH), "attention state"),
                        act.In(qkv, bt * 3 * C, "qkv"), B, T, C, NH, threads_);
}

void CpuBackend::AttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv,
                                   TensorSpan state, int B, int T, int C, int NH) {
  CHECK(NH > 0 && C % NH == 0) << "C=" << C << " not divisible by NH=" << NH;
  const size_t bt = Mul(B, T);
  const size_t scratch = Mul(threads_, Mul(T, T));
  if (attention_scratch_.size() < scratch) attention_scratch_.resize(scratch);
  cpu::ActivationStaging act = StageActivations();
  cpu::AttentionBackward(act.Out(dqkv, bt * 3 * C, "dqkv"), act.In(dout, bt * C, "attention dout"),
                         act.In(qkv, bt * 3 * C, "qkv"),
                         CheckedF32(state, AttentionStateNumel(B, T, C, NH), "attention state"),
                         attention_scratch_.data(), B, T, C, NH, threads_);
}

void CpuBackend::GeluForward(TensorSpan out, TensorSpan inp, size_t n) {
  cpu::ActivationStaging act = StageActivations();
  cpu::GeluForward(act.Out(out, n, "gelu out"), act.In(inp, n, "gelu inp"), n, threads_);
}

void CpuBackend::GeluBackward(TensorSpan dinp, TensorSpan inp, TensorSpan dout, size_t n) {
  cpu::ActivationStaging act = StageActivations();
  cpu::GeluBackward(act.Out(dinp, n, "gelu dinp"), act.In(inp, n, "gelu inp"),
                    act.In(dout, n, "gelu dout"), n, threads_);
}

void CpuBackend::ResidualForward(TensorSpan out, TensorSpan inp1, TensorSpan inp2, size_t n) {
  // Three fp32 spans in any mode: the gradient tree's folds of fp32
  // parameter-gradient arenas (backend.h); otherwise three activations.
  if (out.dtype == DType::kFloat32 && inp1.dtype == DType::kFloat32 &&
      inp2.dtype == DType::kFloat32) {
    cpu::ResidualForward(CheckedF32(out, n, "residual out"), CheckedF32(inp1, n, "residual inp1"),
                         CheckedF32(inp2, n, "residual inp2"), n, threads_);
    return;
  }
  cpu::ActivationStaging act = StageActivations();
  cpu::ResidualForward(act.Out(out, n, "residual out"), act.In(inp1, n, "residual inp1"),
                       act.In(inp2, n, "residual inp2"), n, threads_);
}

void CpuBackend::ResidualBackward(TensorSpan dinp1, TensorSpan dinp2, TensorSpan dout, size_t n) {
  cpu::ActivationStaging act = StageActivations();
  cpu::ResidualBackward(act.Out(dinp1, n, "residual dinp1"), act.Out(dinp2, n, "residual dinp2"),
                        act.In(dout, n, "residual dout"), n, threads_);
}

void CpuBackend::CrossEntropyForward(TensorSpan losses, TensorSpan lse, TensorSpan logits,
                                     TensorSpan targets, int N, int V, int Vp) {
  CHECK(V > 0 && V <= Vp) << "V=" << V << " Vp=" << Vp;
  cpu::ActivationStaging act = StageActivations();
  cpu::CrossEntropyForward(CheckedF32(losses, N, "losses"), CheckedF32(lse, N, "lse"),
                           act.In(logits, Mul(N, Vp), "logits"), CheckedI32(targets, N, "targets"),
                           N, V, Vp, threads_);
}

void CpuBackend::EncoderForwardShard(TensorSpan out, TensorSpan inp, TensorSpan wte, TensorSpan wpe,
                                     int vocab_start, int Vs, int B, int T, int C) {
  CheckVocabShard(vocab_start, Vs);
  const size_t bt = Mul(B, T);
  cpu::ActivationStaging act = StageActivations();
  cpu::EncoderForwardShard(act.Out(out, bt * C, "encoder out"), CheckedI32(inp, bt, "encoder inp"),
                           CheckedF32(wte, Mul(Vs, C), "wte"), OptionalF32(wpe, Mul(T, C), "wpe"),
                           vocab_start, Vs, B, T, C, threads_);
}

void CpuBackend::EncoderBackwardShard(TensorSpan dwte, TensorSpan dwpe, TensorSpan dout,
                                      TensorSpan inp, int vocab_start, int Vs, int B, int T,
                                      int C) {
  CheckVocabShard(vocab_start, Vs);
  const size_t bt = Mul(B, T);
  cpu::ActivationStaging act = StageActivations();
  cpu::EncoderBackwardShard(CheckedF32(dwte, Mul(Vs, C), "dwte"),
                            OptionalF32(dwpe, Mul(T, C), "dwpe"),
                            act.In(dout, bt * C, "encoder dout"),
                            CheckedI32(inp, bt, "encoder inp"), vocab_start, Vs, B, T, C, threads_);
}

void CpuBackend::CrossEntropyShardMax(TensorSpan row_max, TensorSpan logits, int N, int V, int Vs,
                                      int vocab_start) {
  CheckVocabShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  cpu::ActivationStaging act = StageActivations();
  cpu::CrossEntropyShardMax(CheckedF32(row_max, N, "row_max"),
                            act.In(logits, Mul(N, Vs), "logits"), N, V, Vs, vocab_start, threads_);
}

void CpuBackend::CrossEntropyShardSums(TensorSpan sums, TensorSpan logits, TensorSpan row_max,
                                       TensorSpan targets, int N, int V, int Vs, int vocab_start) {
  CheckVocabShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  cpu::ActivationStaging act = StageActivations();
  cpu::CrossEntropyShardSums(CheckedF32(sums, Mul(2, N), "sums"),
                             act.In(logits, Mul(N, Vs), "logits"),
                             CheckedF32(row_max, N, "row_max"), CheckedI32(targets, N, "targets"),
                             N, V, Vs, vocab_start, threads_);
}

void CpuBackend::CrossEntropyShardFinish(TensorSpan losses, TensorSpan lse, TensorSpan row_max,
                                         TensorSpan sums, int N) {
  cpu::CrossEntropyShardFinish(CheckedF32(losses, N, "losses"), CheckedF32(lse, N, "lse"),
                               CheckedF32(row_max, N, "row_max"),
                               CheckedF32(sums, Mul(2, N), "sums"), N, threads_);
}

void CpuBackend::CrossEntropyShardBackward(TensorSpan dlogits, TensorSpan logits, TensorSpan lse,
                                           TensorSpan targets, TensorSpan dlosses, int N, int V,
                                           int Vs, int vocab_start) {
  CheckVocabShard(vocab_start, Vs);
  CHECK(V > 0) << "V=" << V;
  CheckInPlaceOrApart(dlogits, logits);
  cpu::ActivationStaging act = StageActivations();
  // In place (dlogits == logits) both share one fp32 copy (the staging's).
  cpu::CrossEntropyShardBackward(
      act.Out(dlogits, Mul(N, Vs), "dlogits"), act.In(logits, Mul(N, Vs), "logits"),
      CheckedF32(lse, N, "lse"), CheckedI32(targets, N, "targets"),
      CheckedF32(dlosses, N, "dlosses"), N, V, Vs, vocab_start, threads_);
}

}  // namespace cohort::compute
