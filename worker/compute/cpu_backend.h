#pragma once
// CpuBackend: the Backend on host memory in fp32. Matrix products (linear
// layers and the attention score and value products) run through OpenBLAS's
// cblas_sgemm, single-threaded per call, over output tiles fixed by the shape
// (linear) or per (batch, head) (attention) spread across OpenMP threads;
// everything else is OpenMP loops over independent outputs, the exp-heavy
// ones (GELU, softmax, loss) vectorised with AVX2 where the CPU has it (see
// cpu_kernels.h). Results are bitwise identical for any `num_threads` on a
// given CPU.
//
// Activations are fp32 by default. CpuBackendOptions::activation_dtype
// kBFloat16 stores them in bf16 instead (backend.h, "Activation storage"):
// each op widens its bf16 activations into fp32 scratch, runs the fp32
// kernel and rounds what it stores once (cpu_activation_staging.h), so its
// results are bitwise the fp32 op's on the widened inputs, rounded. That
// mode is the reference of a GPU's bf16 activation storage and lets the
// model's mixed-dtype orchestration run in CPU tests; it is slower than fp32
// (every op copies its activations twice) and on purpose not offered on the
// command line: a CPU job trains in fp32.
//
// Thread-safety: thread-compatible (one caller at a time); the attention
// backward and the bf16 mode keep scratch memory between calls.

#include <string_view>
#include <vector>

#include "worker/compute/backend.h"
#include "worker/compute/cpu_activation_staging.h"

namespace cohort::compute {

struct CpuBackendOptions {
  // OpenMP threads for every kernel, products included (each sgemm call runs
  // with one OpenBLAS thread; the parallelism is over independent blocks).
  // 0: omp_get_max_threads() (OMP_NUM_THREADS, else the number of cores).
  int num_threads = 0;
  // The dtype of the activation spans every op takes: kFloat32 (the CPU's
  // training mode) or kBFloat16 (the reference of a GPU's bf16 storage, for
  // tests; see the file comment). Any other dtype is a programmer error.
  DType activation_dtype = DType::kFloat32;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options = {});

  int num_threads() const { return threads_; }

  std::string_view name() const override { return "cpu"; }
  DType activation_dtype() const override { return activation_dtype_; }
  bool host_memory() const override { return true; }
  absl::Status ReserveScratch(const PassShape& shape) override;
  // Backend memory is host memory here.
  absl::StatusOr<Buffer> AllocateHost(DType dtype, size_t numel) override {
    return Allocate(dtype, numel);
  }

  absl::StatusOr<Buffer> Allocate(DType dtype, size_t numel) override;
  void Zero(TensorSpan dst) override;
  void CopyFromHost(TensorSpan dst, const void* src) override;
  void CopyToHost(void* dst, TensorSpan src) override;
  void CopyWithin(TensorSpan dst, TensorSpan src) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

  void LayerNormForward(TensorSpan out, TensorSpan mean, TensorSpan rstd, TensorSpan inp,
                        TensorSpan weight, TensorSpan bias, int N, int C) override;
  void LayerNormBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias, TensorSpan dout,
                         TensorSpan inp, TensorSpan weight, TensorSpan mean, TensorSpan rstd, int N,
                         int C) override;
  // The default's two ops in one, so that with bf16 activations the
  // LayerNorm reads the residual sum before it is rounded (as a GPU's
  // fused kernel does); with fp32 ones the default's bits.
  void ResidualLayerNormForward(TensorSpan residual_out, TensorSpan out, TensorSpan mean,
                                TensorSpan rstd, TensorSpan inp1, TensorSpan inp2,
                                TensorSpan weight, TensorSpan bias, int N, int C) override;
  void MatmulForward(TensorSpan out, TensorSpan inp, TensorSpan weight, TensorSpan bias, int N,
                     int C, int OC) override;
  // Likewise: the GELU reads the product before it is rounded.
  void MatmulGeluForward(TensorSpan out, TensorSpan pre, TensorSpan inp, TensorSpan weight,
                         TensorSpan bias, int N, int C, int OC) override;
  void MatmulBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias, TensorSpan dout,
                      TensorSpan inp, TensorSpan weight, int N, int C, int OC) override;
  void MatmulGeluBackward(TensorSpan dpre, TensorSpan dpre_bias, TensorSpan dweight,
                          TensorSpan dbias, TensorSpan dout, TensorSpan act, TensorSpan pre,
                          TensorSpan weight, int N, int C, int OC) override;
  size_t AttentionStateNumel(int B, int T, int C, int NH) const override;
  void AttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B, int T, int C,
                        int NH) override;
  void AttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv, TensorSpan state, int B,
                         int T, int C, int NH) override;
  void GeluForward(TensorSpan out, TensorSpan inp, size_t n) override;
  void GeluBackward(TensorSpan dinp, TensorSpan inp, TensorSpan dout, size_t n) override;
  void ResidualForward(TensorSpan out, TensorSpan inp1, TensorSpan inp2, size_t n) override;
  void ResidualBackward(TensorSpan dinp1, TensorSpan dinp2, TensorSpan dout, size_t n) override;
  void CrossEntropyForward(TensorSpan losses, TensorSpan lse, TensorSpan logits, TensorSpan targets,
                           int N, int V, int Vp) override;
  void EncoderForwardShard(TensorSpan out, TensorSpan inp, TensorSpan wte, TensorSpan wpe,
                           int vocab_start, int Vs, int B, int T, int C) override;
  void EncoderBackwardShard(TensorSpan dwte, TensorSpan dwpe, TensorSpan dout, TensorSpan inp,
                            int vocab_start, int Vs, int B, int T, int C) override;
  void CrossEntropyShardMax(TensorSpan row_max, TensorSpan logits, int N, int V, int Vs,
                            int vocab_start) override;
  void CrossEntropyShardSums(TensorSpan sums, TensorSpan logits, TensorSpan row_max,
                             TensorSpan targets, int N, int V, int Vs, int vocab_start) override;
  void CrossEntropyShardFinish(TensorSpan losses, TensorSpan lse, TensorSpan row_max,
                               TensorSpan sums, int N) override;
  void CrossEntropyShardBackward(TensorSpan dlogits, TensorSpan logits, TensorSpan lse,
                                 TensorSpan targets, TensorSpan dlosses, int N, int V, int Vs,
                                 int vocab_start) override;
  // cpu_backend_optimizer.cc.
  void SumOfSquaresPieces(TensorSpan sums, TensorSpan grads, TensorSpan pieces) override;
  void FinishGradNorm(TensorSpan scalars, TensorSpan sums, double max_norm) override;
  void SumLosses(TensorSpan sum, TensorSpan losses) override;
  void SkipUpdateUnlessFinite(TensorSpan scalars, TensorSpan values) override;
  void ClipAdamW(TensorSpan params, TensorSpan m, TensorSpan v, TensorSpan grads,
                 TensorSpan scalars, size_t begin, size_t end, size_t moment_base, bool decay,
                 const AdamWScalars& adamw) override;

 private:
  // The activation spans of one op call (cpu_activation_staging.h).
  cpu::ActivationStaging StageActivations() {
    return cpu::ActivationStaging(activation_dtype_, threads_, &activation_scratch_);
  }

  const int threads_;
  const DType activation_dtype_;
  // The bf16 mode's fp32 copies of an op's activations, one per span.
  std::vector<std::vector<float>> activation_scratch_;
  // AttentionBackward's per-thread (T,T) gradient of the probabilities.
  std::vector<float> attention_scratch_;
  // MatmulGeluBackward's gradient of the GELU's output, (N,C) of the MLP's
  // widest pass; reserved by ReserveScratch.
  std::vector<float> gelu_grad_scratch_;
};

}  // namespace cohort::compute
