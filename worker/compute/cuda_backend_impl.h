#pragma once
// The CUDA backend's class and the plumbing its files share (internal to
// cohort_compute: include it from cuda_backend*.cc only). The class is
// declared here so that its methods can live in files along its seams:
// cuda_backend.cc (creation, errors, memory), cuda_backend_gemm.cc (the
// cuBLASLt GEMMs, the linear layers, the kernels' attention products),
// cuda_backend_attention.cc (attention: cuDNN's fused attention, or the
// kernels of cuda_backend_attention_kernels.cc), cuda_backend_fused.cc (the
// fused ops, the epilogues' bias gradients), cuda_backend_ops.cc (the
// kernels of the other ops and the optimizer's) and cuda_backend_graph.cc
// (captured op sequences: CUDA graphs).
// The contract is cuda_backend.h's.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/compute/activation_access.h"
#include "worker/compute/attention_report.h"
#include "worker/compute/cuda_backend.h"
#include "worker/compute/cuda_cudnn_library.h"
#include "worker/compute/cuda_cudnn_sdpa.h"
#include "worker/compute/cuda_epilogue.h"
#include "worker/compute/cuda_kernels.h"
#include "worker/compute/cuda_kernels_optimizer.h"
#include "worker/compute/device_arena.h"
#include "worker/compute/gemm_shapes.h"
#include "worker/compute/gpu_architectures.h"
#include "worker/compute/gpu_launch_plan.h"
#include "worker/compute/span_checks.h"

namespace cohort::compute::cuda_impl {

using gpu_plan::AlignUp;

// cuBLASLt's and cuBLAS's workspaces, each pinned for the backend's life
// (cuBLAS picks the same kernels only while its workspace stays the same).
// 32 MiB is what NVIDIA recommends for Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

inline size_t Mul(size_t a, size_t b) { return a * b; }

// The kernels' attention state: the probabilities (B,NH,T,T).
inline size_t ProbabilitiesNumel(int B, int T, int NH) { return Mul(Mul(B, NH), Mul(T, T)); }

using kernel_math::Bf16;

// CUDA and cuBLAS codes are converted here, once (docs/conventions.md, Errors).
inline std::string CudaErrorText(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), ": ", cudaGetErrorString(error));
}

inline std::string BlasErrorText(cublasStatus_t status) {
  return absl::StrCat(cublasGetStatusName(status), ": ", cublasGetStatusString(status));
}

// Scratch the ops keep between calls, one growing allocation per use.
enum ScratchSlot : int {
  kAttentionHeads,  // q, k, v and the per-head output or its gradient
  kAttentionGrads,  // dq, dk, dv
  kScoreGrads,      // d(scores), (B,NH,T,T)
  kEncoderSort,     // the token sort of EncoderBackwardShard
  kColumnSums,      // partial sums of dbias and LayerNorm's dweight
  kOperandA,        // bf16: a GEMM's fp32 A and B operands, rounded (the kernels'
  kOperandB,        //   attention products; weights outside the working copy)
  kUnfusedProduct,  // bf16: the fp32 product of a GEMM whose epilogue runs apart
  kAttentionWide,   // bf16, the kernels' attention: fp32 qkv, dqkv and out/dout
  kSdpaGrads,       // cuDNN attention's backward: the bf16 dqkv (B,T,3C) it writes
  kSdpaWorkspace,   // cuDNN attention's plans' workspace
  kScratchSlots,
};

// A single GEMM (gemm_shapes.h; batch 1) as cuBLASLt plans it: its shape
// as handed to the library (bf16 operands with their padded leading
// dimensions) and what its operands allow: the largest power of two (<= 256)
// dividing each operand's address and column stride (AlignmentOf). The
// model's activation views start on 256 bytes, but a column of odd width
// (75 floats: 300 bytes) or a view of a weight inside the parameter arena
// may be aligned to 4 only, and an algorithm chosen for 256-byte operands
// (cuBLASLt's default assumption) may refuse them or fault. A shape seen at
// another alignment gets a plan of its own.
struct PlanKey {
  GemmShape shape;
  uint32_t align_a = 256, align_b = 256, align_c = 256;
  // C's and D's type: an activation (bf16 in precision bf16) or fp32 (a
  // weight gradient, scratch). A's and B's follow the precision.
  cudaDataType_t c_type = CUDA_R_32F;
  // An epilogue's plan is its own: the epilogue and its vectors' alignment
  // (the heuristic reads the pointers' values for it) are part of the key.
  Epilogue epilogue = Epilogue::kNone;
  uint32_t align_bias = 256, align_aux = 256;

  auto Tie() const {
    return std::tie(shape.transa, shape.transb, shape.m, shape.n, shape.k, shape.lda, shape.ldb,
                    shape.ldc, align_a, align_b, align_c, c_type, epilogue, align_bias, align_aux);
  }
  bool operator<(const PlanKey& other) const { return Tie() < other.Tie(); }
};

// What cuBLASLt may assume of an operand: the largest power of two (<= 256)
// dividing both its address and its column stride in bytes (ld x element
// size): every column starts on that boundary, not only the first. bf16
// operands of odd width (75 columns: 150-byte columns) are 2-byte aligned.
// The leading dimension of a bf16 operand of `rows` rows: a multiple of 8
// elements, 16 bytes.
inline int BfloatLeadingDimension(int rows) { return (rows + 7) / 8 * 8; }

inline uint32_t AlignmentOf(const void* pointer, int ld, size_t element_bytes) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  const uint64_t stride = static_cast<uint64_t>(ld) * element_bytes;
  uint32_t alignment = 256;
  while (alignment > 1 && (address % alignment != 0 || stride % alignment != 0)) alignment /= 2;
  return alignment;
}

// A shape's descriptors and the one algorithm chosen for it, or, where
// cuBLASLt offered none, cublasGemmEx for it (same operand and compute types,
// so the same math by another kernel; chosen once like an algorithm).
// A plan with an epilogue that cuBLASLt cannot run for the shape (no
// algorithm, or an operand the epilogue does not allow) is `unfused`: the
// caller computes the product and the epilogue's work with separate kernels,
// also chosen once per shape and logged once.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool gemm_ex = false;
  bool unfused = false;
};

// The storage of a GEMM's operands and output (CUDA_R_32F or CUDA_R_16BF).
// bf16 A and B are activations, read as stored; fp32 ones are read as they
// are in precisions fp32 and tf32 and, in bf16, from the weights' working
// copy or rounded per call (CudaBackend::Operand). C and D are stored as
// their type says: bf16 activations rounded once from the fp32 accumulator.
struct GemmTypes {
  cudaDataType_t a = CUDA_R_32F;
  cudaDataType_t b = CUDA_R_32F;
  cudaDataType_t c = CUDA_R_32F;
};

inline size_t CudaTypeBytes(cudaDataType_t type) {
  return type == CUDA_R_16BF ? sizeof(uint16_t) : sizeof(float);
}

// What Gemm did with a call's epilogue: ran it (or met a failure, now
// pending: nothing more to do either way), or left it to the caller.
enum class EpilogueRun { kDone, kUnfused };

// Heuristic results asked for per shape: the first whose state is success
// is taken. More than one so that a result cuBLASLt lists but cannot run
// does not leave the shape without an algorithm; in the heuristic's order,
// so the choice is as repeatable as the heuristic.
constexpr int kHeuristicResults = 8;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  absl::Status Init();

  std::string_view name() const override { return "cuda"; }
  // bf16 in precision bf16, fp32 otherwise (cuda_backend.h).
  DType activation_dtype() const override {
    return options_.precision == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat32;
  }
  bool host_memory() const override { return false; }
  absl::Status ReserveScratch(const PassShape& shape) override;
  absl::StatusOr<size_t> ScratchBytes(const PassShape& shape) override;
  absl::Status ReserveDeviceMemory(size_t bytes) override;
  size_t ParamCopyBytes(size_t params_numel, const std::vector<ParamBlock>& blocks) const override;
  absl::StatusOr<Buffer> AllocateHost(DType dtype, size_t numel) override;

  absl::StatusOr<Buffer> Allocate(DType dtype, size_t numel) override;
  void Zero(TensorSpan dst) override;
  void CopyFromHost(TensorSpan dst, const void* src) override;
  void CopyToHost(void* dst, TensorSpan src) override;
  void CopyWithin(TensorSpan dst, TensorSpan src) override;
  void CopyFromHostAsync(TensorSpan dst, const void* src) override;
  void CopyToHostAsync(void* dst, TensorSpan src) override;
  absl::Status Synchronize() override;
  // cuda_backend_side_copy.cc.
  std::unique_ptr<SideCopy> CopyToHostSide(void* dst, TensorSpan src) override;
  absl::Status AttachParams(TensorSpan params, const std::vector<ParamBlock>& blocks) override;
  void RefreshParamCopy() override;
  void DetachParams(TensorSpan params) override;
  bool SupportsCapture() const override { return true; }
  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<CapturedOps>> EndCapture() override;
  absl::Status Replay(const CapturedOps& ops) override;

  void LayerNormForward(TensorSpan out, TensorSpan mean, TensorSpan rstd, TensorSpan inp,
                        TensorSpan weight, TensorSpan bias, int N, int C) override;
  void LayerNormBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias, TensorSpan dout,
                         TensorSpan inp, TensorSpan weight, TensorSpan mean, TensorSpan rstd, int N,
                         int C) override;
  void MatmulForward(TensorSpan out, TensorSpan inp, TensorSpan weight, TensorSpan bias, int N,
                     int C, int OC) override;
  void MatmulBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias, TensorSpan dout,
                      TensorSpan inp, TensorSpan weight, int N, int C, int OC) override;
  void MatmulGeluForward(TensorSpan out, TensorSpan pre, TensorSpan inp, TensorSpan weight,
                         TensorSpan bias, int N, int C, int OC) override;
  void MatmulGeluBackward(TensorSpan dpre, TensorSpan dpre_bias, TensorSpan dweight,
                          TensorSpan dbias, TensorSpan dout, TensorSpan act, TensorSpan pre,
                          TensorSpan weight, int N, int C, int OC) override;
  void ResidualLayerNormForward(TensorSpan residual_out, TensorSpan out, TensorSpan mean,
                                TensorSpan rstd, TensorSpan inp1, TensorSpan inp2,
                                TensorSpan weight, TensorSpan bias, int N, int C) override;
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
  void SumOfSquaresPieces(TensorSpan sums, TensorSpan grads, TensorSpan pieces) override;
  void FinishGradNorm(TensorSpan scalars, TensorSpan sums, double max_norm) override;
  void SumLosses(TensorSpan sum, TensorSpan losses) override;
  void SkipUpdateUnlessFinite(TensorSpan scalars, TensorSpan values) override;
  void ClipAdamW(TensorSpan params, TensorSpan m, TensorSpan v, TensorSpan grads,
                 TensorSpan scalars, size_t begin, size_t end, size_t moment_base, bool decay,
                 const AdamWScalars& adamw) override;

 private:
  // A call a capture may not hold (cuda_backend_graph.cc): true, with the
  // open capture failed naming `call`, while capturing (the caller then
  // does not make it); false otherwise.
  bool ForbidInCapture(const char* call);
  // Makes the device current; false (the op is skipped) while a failure
  // waits for Synchronize.
  bool Begin();
  void Fail(absl::Status status);
  void Check(cudaError_t error, const char* what);
  void CheckBlas(cublasStatus_t status, const char* what);
  // After a kernel launch: the launch's own error, if any.
  void CheckLaunch(const char* what) { Check(cudaGetLastError(), what); }
  // Runs `launch` (which enqueues kernels on stream_) unless a failure is
  // pending, then reads the launch's error under `what`.
  template <typename Enqueue>
  void Launch(const char* what, Enqueue&& launch) {
    if (!Begin()) return;
    launch();
    CheckLaunch(what);
  }

  // Device memory from the arena or cudaMalloc; nullptr with `error` set:
  // ResourceExhausted for a shortage, or a device failure cudaMalloc was the
  // first to see, which is also left pending.
  void* RawAllocate(size_t bytes, absl::Status* error);
  void RawFree(void* data);
  // The arena: `bytes` reserved with one cudaMalloc. `overflow`: what it
  // cannot hold comes from cudaMalloc (ReserveDeviceMemory's estimate);
  // otherwise a shortage is ResourceExhausted (CudaBackendOptions::arena_bytes).
  absl::Status ReserveArena(size_t bytes, bool overflow);
  bool InArena(const void* data) const;
  // Each scratch slot's bytes for passes up to `shape`; settles attention.
  absl::Status ScratchWanted(const PassShape& shape, size_t* wanted);
  // Grows scratch `slot` to at least `bytes`: OK, ResourceExhausted naming
  // the shortfall (not recorded: the caller decides), or RawAllocate's
  // pending device failure.
  absl::Status GrowScratch(ScratchSlot slot, size_t bytes);
  // At least `bytes` of scratch for `slot` (contents undefined), or nullptr
  // after recording ResourceExhausted.
  void* Scratch(ScratchSlot slot, size_t bytes);

  // Pins the GEMMs' compute type and cuBLAS's math mode for the precision
  // (see the definition); FailedPrecondition when the environment would
  // change them. Part of Init, after the handles exist.
  absl::Status PinGemmMath();
  // One GEMM (batch 1) through cuBLASLt, or cublasGemmEx where its plan
  // says, with `epilogue` fused where cuBLASLt runs it for the shape;
  // kUnfused (nothing computed) where it does not, for the caller to run
  // the product and the epilogue's work apart (cuda_backend_fused.cc).
  EpilogueRun Gemm(const GemmCall& call, const GemmTypes& types, const GemmEpilogue& epilogue = {});
  // The CUDA type of the activations (CUDA_R_16BF in precision bf16).
  cudaDataType_t ActivationType() const { return bf16_ ? CUDA_R_16BF : CUDA_R_32F; }
  // Where a GEMM whose epilogue runs apart leaves its fp32 product for the
  // kernel that finishes it into `out` (numel elements): `out` itself when
  // activations are fp32, else scratch (kUnfusedProduct, reserved by
  // ScratchWanted: only shapes cuBLASLt refuses an epilogue use it);
  // nullptr after recording a failure.
  template <typename S>
  float* UnfusedProduct(S* out, size_t numel) {
    if constexpr (std::is_same_v<S, float>) {
      return out;
    } else {
      return static_cast<float*>(Scratch(kUnfusedProduct, numel * sizeof(float)));
    }
  }
  const GemmPlan* PlanFor(const PlanKey& key, const GemmEpilogue& epilogue);
  // Sets the call's epilogue pointers on the plan's descriptor.
  bool SetEpiloguePointers(const GemmPlan& plan, const GemmShape& shape,
                           const GemmEpilogue& epilogue);
  // dbias (n) += the bias gradient an epilogue wrote to `partial` (the
  // epilogues write; the backend's gradients accumulate).
  void AccumulateBiasGrad(float* dbias, const float* partial, int n);
  // MatmulBackward's dweight and dbias (cuda_backend_fused.cc); dbias may
  // be null.
  // dout and inp are activations (the activation dtype).
  void WeightAndBiasGrad(float* dweight, float* dbias, const void* dout, const void* inp, int N,
                         int C, int OC);
  // A GEMM operand of storage `type` as the GEMM reads it. bf16: an
  // activation, `data` itself. fp32 in precision bf16: a weight's place in
  // the working copy, or the (rows x cols, leading dimension *ld)
  // column-major matrix at `data` rounded to bf16 in scratch `slot`, its
  // columns padded to a 16-byte stride (tensor-core kernels want it; *ld
  // becomes the padded one), or nullptr after recording a failure. fp32
  // otherwise: `data` itself.
  const void* Operand(const void* data, cudaDataType_t type, int rows, int64_t cols, int* ld,
                      ScratchSlot slot);
  // The working copy of a weight: for an fp32 operand that is whole rows of
  // an attached block, its place in the copy (with *ld the copy's padded
  // leading dimension); nullptr otherwise.
  const void* CopiedOperand(const float* data, int rows, int64_t cols, int* ld) const;
  // The copy as the kernels take it (a null copy when none is attached).
  cuda::ParamCopyRef CopyRef() const;
  // Frees the copy, whichever arena it mirrors.
  void FreeParamCopy();
  // A strided batch of GEMMs through cuBLAS (attention's products on the
  // kernels' fp32 copies), each batch's operands packed (stride = leading
  // dimension x stored columns); operands and output fp32.
  void BatchedGemm(const GemmCall& call);

  // ---- Attention: cuDNN's fused attention or the kernels -------------------
  // (cuda_backend_attention.cc). Members of this block are that file's.
  // Init's part: loads cuDNN and creates its handle where the mode, the
  // precision and the device allow it; decides for the kernels (reported)
  // where they do not in auto mode, and fails where --fused_attention=cudnn.
  absl::Status InitAttention(int compute_major);
  // ReserveScratch's part: decides for the session (once): cuDNN where both
  // plans of the largest shape build, else the kernels (auto) or an error
  // (cudnn); then the attention scratch slots' sizes into `wanted`.
  absl::Status ChooseAttention(const PassShape& shape, size_t* wanted);

  // The destructor's part: plans, then the handle (before the library).
  void ReleaseAttention();
  bool UsesCudnn(int B, int T, int C, int NH) const;
  void DecideForKernels(std::string reason, bool fallback);
  // The plan for a shape and direction, built on first use; nullptr after
  // recording the failure.
  const sdpa::Plan* SdpaPlanFor(const sdpa::Shape& shape, sdpa::Direction direction);
  void CudnnAttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B, int T, int C,
                             int NH);
  void CudnnAttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv, TensorSpan state,
                              int B, int T, int C, int NH);
  // In bf16, the kernels' fp32 copies (kAttentionWide, in floats) for btc =
  // B*T*C: qkv (3 btc), dqkv (3 btc) and the output or its gradient (btc).
  static size_t KernelAttentionWideFloats(size_t btc) { return 7 * btc; }
  void KernelAttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B, int T, int C,
                              int NH);
  void KernelAttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv, TensorSpan state,
                               int B, int T, int C, int NH);
  // Their fp32 computation, on fp32 arrays (the activations, or their
  // widened copies in bf16); att is the state. dx accumulates.
  void KernelAttentionForwardF32(float* y, float* att, const float* x, int B, int T, int C, int NH);
  void KernelAttentionBackwardF32(float* dx, const float* dy, const float* x, const float* att,
                                  int B, int T, int C, int NH);

  std::unique_ptr<CudnnLibrary> cudnn_;  // null: the kernels
  cudnnHandle_t cudnn_handle_ = nullptr;
  // Decided at the first ReserveScratch (or in Init for the kernels);
  // before that AttentionStateNumel answers for cuDNN where it is loaded.
  bool attention_decided_ = false;
  AttentionImplementation attention_ = AttentionImplementation::kKernels;
  std::map<std::pair<sdpa::Shape, sdpa::Direction>, std::unique_ptr<sdpa::Plan>> sdpa_plans_;
  // ---- end of attention's block ------------------------------------------

  CudaBackendOptions options_;
  cublasComputeType_t compute_type_ = CUBLAS_COMPUTE_32F;
  // bf16: GEMM operands rounded to bf16 (tensor cores), fp32 accumulation and
  // results; the type cuBLAS is told the operands have.
  bool bf16_ = false;
  cudaDataType_t operand_type_ = CUDA_R_32F;
  cudaStream_t stream_ = nullptr;
  // CopyToHostSide's stream, made at its first use.
  cudaStream_t side_stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* lt_workspace_ = nullptr;
  void* blas_workspace_ = nullptr;
  char* arena_base_ = nullptr;
  std::optional<DeviceArena> arena_;
  bool arena_overflow_ = false;
  bool overflow_logged_ = false;
  struct ScratchBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  ScratchBuffer scratch_[kScratchSlots];
  // The weights' bf16 working copy (AttachParams; bf16 only): the arena it
  // mirrors, its layout, and in device memory the copy and the layout's
  // blocks for the kernels.
  struct ParamCopy {
    const float* params = nullptr;
    size_t numel = 0;
    ParamCopyLayout layout;
    void* copy = nullptr;
    void* blocks = nullptr;
  };
  std::optional<ParamCopy> param_copy_;
  std::map<PlanKey, GemmPlan> plans_;
  absl::Status error_;
  // A capture is open on stream_ (cuda_backend_graph.cc), and the first
  // forbidden call made in it.
  bool capturing_ = false;
  absl::Status capture_failure_;
  // Moves whenever memory the backend keeps for itself, which captured ops
  // read, is freed or replaced (scratch, the working copy): captures of an
  // older generation are stale.
  uint64_t memory_generation_ = 0;
};

}  // namespace cohort::compute::cuda_impl
