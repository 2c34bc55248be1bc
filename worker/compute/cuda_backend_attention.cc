// CudaBackend (cuda_backend_impl.h): causal attention, through cuDNN's fused
// flash attention (cuda_cudnn_sdpa.h) or the backend's own kernels, chosen
// once per session.
//
// cuDNN: the forward rounds qkv to bf16 into the attention state, runs the
// fused forward writing the bf16 output and the fp32 softmax statistics
// into the state, and widens the output into `out`; the backward rounds
// dout to bf16, runs the fused backward on the state's very bits (nothing
// rounded twice) into a bf16 dqkv in scratch, and adds that to the fp32
// dqkv. The state is sdpa::StateLayoutOf's: about (4C + 2NH) bytes per token
// instead of 4 NH T for the probabilities. Only in precision bf16 (the fused
// engines compute on bf16 inputs); fp32 and tf32 keep the kernels, whose
// products have the precision's arithmetic.
//
// The kernels (cuda_backend_attention_kernels.cc): the state is the softmax
// probabilities (B,NH,T,T), as on the CPU.
//
// The choice: --fused_attention (CudaBackendOptions::fused_attention). off:
// the kernels. cudnn: cuDNN or an error at creation (no library, an old
// version, not bf16, a device older than Ampere) or at ReserveScratch (the
// session's shapes do not plan). auto: cuDNN where all of that holds, else
// the kernels; the choice and a fallback's reason go to the log once and to
// the metric cohort_worker_attention_implementation (attention_report.h).
// Before the first ReserveScratch, AttentionStateNumel answers for cuDNN
// where cuDNN is loaded (a model lays out its activations after reserving
// its scratch, so it sees the decided answer; an estimate made before sees
// the likely one).

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {
namespace {

sdpa::Shape SdpaShape(int B, int T, int C, int NH) {
  return sdpa::Shape{.B = B, .T = T, .NH = NH, .hs = NH > 0 ? C / NH : 0};
}

}  // namespace

// ---- Choosing -----------------------------------------------------------------

absl::Status CudaBackend::InitAttention(int compute_major) {
  const FusedAttention mode = options_.fused_attention;
  if (mode == FusedAttention::kOff) {
    DecideForKernels("--fused_attention=off", /*fallback=*/false);
    return absl::OkStatus();
  }
  const bool required = mode == FusedAttention::kCudnn;
  // `fallback`: cuDNN was wanted and is missing (a warning), rather than
  // not applicable to the job (precision fp32 or tf32: info).
  auto refuse = [&](std::string reason, bool fallback = true) {
    if (required) {
      return absl::FailedPreconditionError(
          absl::StrCat("--fused_attention=cudnn on CUDA device ", options_.device_index, ": ",
                       reason));
    }
    DecideForKernels(std::move(reason), fallback);
    return absl::OkStatus();
  };
  if (options_.precision != Precision::kBf16) {
    return refuse(absl::StrCat("precision ", PrecisionName(options_.precision),
                               ": cuDNN's fused attention computes on bf16 inputs"),
                  /*fallback=*/false);
  }
  if (compute_major < 8) {
    return refuse("cuDNN's fused flash attention needs compute capability 8.0 or newer");
  }
  absl::StatusOr<std::unique_ptr<CudnnLibrary>> library = CudnnLibrary::Load({});
  if (!library.ok()) return refuse(std::string(library.status().message()));
  const CudnnFunctions& fn = (*library)->fn();
  cudnnHandle_t handle = nullptr;
  if (const cudnnStatus_t s = fn.Create(&handle); s != CUDNN_STATUS_SUCCESS) {
    return refuse(absl::StrCat("cudnnCreate: ", (*library)->ErrorText(s)));
  }
  if (const cudnnStatus_t s = fn.SetStream(handle, stream_); s != CUDNN_STATUS_SUCCESS) {
    const std::string text = (*library)->ErrorText(s);
    fn.Destroy(handle);
    return refuse(absl::StrCat("cudnnSetStream: ", text));
  }
  cudnn_ = std::move(*library);
  cudnn_handle_ = handle;
  return absl::OkStatus();
}

void CudaBackend::DecideForKernels(std::string reason, bool fallback) {
  ReleaseAttention();
  cudnn_.reset();
  attention_decided_ = true;
  attention_ = AttentionImplementation::kKernels;
  ReportAttentionChoice({.implementation = attention_, .reason = std::move(reason)}, fallback);
}

void CudaBackend::ReleaseAttention() {
  sdpa_plans_.clear();
  if (cudnn_handle_ != nullptr) cudnn_->fn().Destroy(cudnn_handle_);
  cudnn_handle_ = nullptr;
}

absl::Status CudaBackend::ChooseAttention(const PassShape& shape, size_t* wanted) {
  const int B = shape.max_batch, T = shape.max_seq, C = shape.attention_width, NH = shape.heads;
  const sdpa::Shape largest = SdpaShape(B, T, C, NH);
  if (cudnn_ != nullptr && NH > 0) {
    absl::Status planned = absl::OkStatus();
    if (const char* reason = sdpa::UnsupportedReason(largest); reason != nullptr) {
      planned = absl::InvalidArgumentError(absl::StrCat("head width ", largest.hs, ": ", reason));
    }
    for (sdpa::Direction direction : {sdpa::Direction::kForward, sdpa::Direction::kBackward}) {
      if (!planned.ok()) break;
      auto [found, inserted] = sdpa_plans_.try_emplace({largest, direction});
      if (!inserted) continue;
      absl::StatusOr<std::unique_ptr<sdpa::Plan>> plan =
          sdpa::BuildPlan(*cudnn_, cudnn_handle_, largest, direction);
      if (plan.ok()) {
        found->second = std::move(*plan);
      } else {
        sdpa_plans_.erase(found);
        planned = plan.status();
      }
    }
    if (!planned.ok()) {
      // A session whose state was laid out for cuDNN cannot change now.
      if (options_.fused_attention == FusedAttention::kCudnn || attention_decided_) {
        return absl::FailedPreconditionError(
            absl::StrCat("cuDNN attention for B=", B, " T=", T, " NH=", NH, ": ",
                         planned.message()));
      }
      DecideForKernels(std::string(planned.message()), /*fallback=*/true);
    } else if (!attention_decided_) {
      attention_decided_ = true;
      attention_ = AttentionImplementation::kCudnn;
      ReportAttentionChoice({.implementation = attention_,
                             .reason = absl::StrCat("cuDNN ", cudnn_->VersionText(), " from ",
                                                    cudnn_->path())},
                            /*fallback=*/false);
    }
  }
  const size_t btc = Mul(Mul(B, T), C);
  if (attention_ == AttentionImplementation::kCudnn) {
    wanted[kSdpaOperands] = AlignUp(btc * sizeof(uint16_t)) + AlignUp(3 * btc * sizeof(uint16_t));
    int64_t workspace = 0;
    for (const auto& [key, plan] : sdpa_plans_) {
      workspace = std::max(workspace, plan->workspace_bytes);
    }
    wanted[kSdpaWorkspace] = static_cast<size_t>(workspace);
  } else {
    wanted[kAttentionHeads] = 4 * btc * sizeof(float);
    wanted[kAttentionGrads] = 3 * btc * sizeof(float);
    wanted[kScoreGrads] = ProbabilitiesNumel(B, T, NH) * sizeof(float);
  }
  return absl::OkStatus();
}

size_t CudaBackend::AttentionOperandNumel(const PassShape& shape) const {
  if (attention_ == AttentionImplementation::kCudnn) return 0;
  return ProbabilitiesNumel(shape.max_batch, shape.max_seq, shape.heads);
}

bool CudaBackend::UsesCudnn(int B, int T, int C, int NH) const {
  if (attention_decided_) return attention_ == AttentionImplementation::kCudnn;
  return cudnn_ != nullptr && sdpa::UnsupportedReason(SdpaShape(B, T, C, NH)) == nullptr;
}

size_t CudaBackend::AttentionStateNumel(int B, int T, int C, int NH) const {
  CHECK(NH > 0 && C % NH == 0) << "C=" << C << " not divisible by NH=" << NH;
  if (UsesCudnn(B, T, C, NH)) return sdpa::StateLayoutOf(SdpaShape(B, T, C, NH)).numel();
  return ProbabilitiesNumel(B, T, NH);
}

void CudaBackend::AttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B, int T,
                                   int C, int NH) {
  CHECK(NH > 0 && C % NH == 0) << "C=" << C << " not divisible by NH=" << NH;
  if (UsesCudnn(B, T, C, NH)) {
    CudnnAttentionForward(out, state, qkv, B, T, C, NH);
  } else {
    KernelAttentionForward(out, state, qkv, B, T, C, NH);
  }
}

void CudaBackend::AttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv,
                                    TensorSpan state, int B, int T, int C, int NH) {
  CHECK(NH > 0 && C % NH == 0) << "C=" << C << " not divisible by NH=" << NH;
  if (UsesCudnn(B, T, C, NH)) {
    // The state holds the bf16 qkv the forward ran on; qkv itself is not read.
    CudnnAttentionBackward(dqkv, dout, state, B, T, C, NH);
  } else {
    KernelAttentionBackward(dqkv, dout, qkv, state, B, T, C, NH);
  }
}

// ---- cuDNN --------------------------------------------------------------------

const sdpa::Plan* CudaBackend::SdpaPlanFor(const sdpa::Shape& shape, sdpa::Direction direction) {
  auto found_plan = sdpa_plans_.find({shape, direction});
  if (found_plan != sdpa_plans_.end()) return found_plan->second.get();
  // Building a plan may allocate; a shape's first pass (run directly) makes it.
  if (ForbidInCapture("building a cuDNN attention plan")) return nullptr;
  auto [found, inserted] = sdpa_plans_.try_emplace({shape, direction});
  absl::StatusOr<std::unique_ptr<sdpa::Plan>> plan =
      sdpa::BuildPlan(*cudnn_, cudnn_handle_, shape, direction);
  if (!plan.ok()) {
    sdpa_plans_.erase(found);
    Fail(plan.status());
    return nullptr;
  }
  found->second = std::move(*plan);
  return found->second.get();
}

namespace {

// The state's parts (sdpa::StateLayoutOf) at `base`.
struct StateParts {
  uint16_t* qkv;
  uint16_t* out;
  float* stats;
};

StateParts PartsOf(void* base, const sdpa::StateLayout& layout) {
  char* bytes = static_cast<char*>(base);
  return StateParts{reinterpret_cast<uint16_t*>(bytes + layout.qkv_bytes),
                    reinterpret_cast<uint16_t*>(bytes + layout.out_bytes),
                    reinterpret_cast<float*>(bytes + layout.stats_bytes)};
}

}  // namespace

void CudaBackend::CudnnAttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B,
                                        int T, int C, int NH) {
  const sdpa::Shape shape = SdpaShape(B, T, C, NH);
  const sdpa::StateLayout layout = sdpa::StateLayoutOf(shape);
  const size_t btc = Mul(Mul(B, T), C);
  float* y = CheckedF32(out, btc, "attention out");
  float* saved = CheckedF32(state, layout.numel(), "attention state");
  const float* x = CheckedF32(qkv, 3 * btc, "qkv");
  if (!Begin()) return;
  const sdpa::Plan* plan = SdpaPlanFor(shape, sdpa::Direction::kForward);
  if (plan == nullptr) return;
  void* workspace = nullptr;
  if (plan->workspace_bytes > 0) {
    workspace = Scratch(kSdpaWorkspace, static_cast<size_t>(plan->workspace_bytes));
    if (workspace == nullptr) return;
  }
  const StateParts parts = PartsOf(saved, layout);
  cuda::NarrowToBf16(parts.qkv, x, static_cast<int64_t>(3 * btc), stream_);
  CheckLaunch("NarrowToBf16 (qkv)");
  if (!Begin()) return;
  if (absl::Status run = sdpa::ExecuteForward(*cudnn_, cudnn_handle_, *plan, shape,
                                              {parts.qkv, parts.out, parts.stats}, workspace);
      !run.ok()) {
    Fail(std::move(run));
    return;
  }
  cuda::WidenBf16(y, parts.out, static_cast<int64_t>(btc), stream_);
  CheckLaunch("WidenBf16 (attention out)");
}

void CudaBackend::CudnnAttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan state, int B,
                                         int T, int C, int NH) {
  const sdpa::Shape shape = SdpaShape(B, T, C, NH);
  const sdpa::StateLayout layout = sdpa::StateLayoutOf(shape);
  const size_t btc = Mul(Mul(B, T), C);
  float* dx = CheckedF32(dqkv, 3 * btc, "dqkv");
  const float* dy = CheckedF32(dout, btc, "attention dout");
  float* saved = CheckedF32(state, layout.numel(), "attention state");
  if (!Begin()) return;
  const sdpa::Plan* plan = SdpaPlanFor(shape, sdpa::Direction::kBackward);
  if (plan == nullptr) return;
  const size_t dout_bytes = AlignUp(btc * sizeof(uint16_t));
  auto* operands = static_cast<char*>(
      Scratch(kSdpaOperands, dout_bytes + AlignUp(3 * btc * sizeof(uint16_t))));
  if (operands == nullptr) return;
  void* workspace = nullptr;
  if (plan->workspace_bytes > 0) {
    workspace = Scratch(kSdpaWorkspace, static_cast<size_t>(plan->workspace_bytes));
    if (workspace == nullptr) return;
  }
  auto* dout16 = reinterpret_cast<uint16_t*>(operands);
  auto* dqkv16 = reinterpret_cast<uint16_t*>(operands + dout_bytes);
  const StateParts parts = PartsOf(saved, layout);
  cuda::NarrowToBf16(dout16, dy, static_cast<int64_t>(btc), stream_);
  CheckLaunch("NarrowToBf16 (attention dout)");
  if (!Begin()) return;
  if (absl::Status run = sdpa::ExecuteBackward(
          *cudnn_, cudnn_handle_, *plan, shape,
          {parts.qkv, parts.out, parts.stats, dout16, dqkv16}, workspace);
      !run.ok()) {
    Fail(std::move(run));
    return;
  }
  cuda::AddBf16(dx, dqkv16, static_cast<int64_t>(3 * btc), stream_);  // the += contract
  CheckLaunch("AddBf16 (dqkv)");
}

}  // namespace cohort::compute::cuda_impl
