// CudaBackend (cuda_backend_impl.h): causal attention, through cuDNN's fused
// flash attention (cuda_cudnn_sdpa.h) or the backend's own kernels, chosen
// once per session.
//
// cuDNN: only in precision bf16 (the fused engines compute on bf16 inputs),
// where the activations are bf16 too (backend.h, "Activation storage"), so
// cuDNN reads qkv and dout and writes the output as they are stored, with
// no conversion pass. The forward writes the output and the fp32 softmax
// statistics, and copies the output into the state (the backward is not
// handed it); the backward writes cuDNN's bf16 dqkv into scratch and adds
// it to dqkv, widened, in fp32, rounded once (the += contract: the model
// zeroes dqkv first, but the op does not assume it). The state is
// sdpa::StateLayoutOf's: about (2C + 4NH) bytes per token instead of
// 4 NH T for the probabilities. fp32 and tf32 keep the kernels, whose
// products have the precision's arithmetic.
//
// The kernels (cuda_backend_attention_kernels.cc): the state is the softmax
// probabilities (B,NH,T,T), as on the CPU; in bf16 they compute on fp32
// copies of the bf16 activations.
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
      return absl::FailedPreconditionError(absl::StrCat("--fused_attention=cudnn on CUDA device ",
                                                        options_.device_index, ": ", reason));
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
        return absl::FailedPreconditionError(absl::StrCat("cuDNN attention for B=", B, " T=", T,
                                                          " NH=", NH, ": ", planned.message()));
      }
      DecideForKernels(std::string(planned.message()), /*fallback=*/true);
    } else if (!attention_decided_) {
      attention_decided_ = true;
      attention_ = AttentionImplementation::kCudnn;
      ReportAttentionChoice(
          {.implementation = attention_,
           .reason = absl::StrCat("cuDNN ", cudnn_->VersionText(), " from ", cudnn_->path())},
          /*fallback=*/false);
    }
  }
  const size_t btc = Mul(Mul(B, T), C);
  if (attention_ == AttentionImplementation::kCudnn) {
    wanted[kSdpaGrads] = 3 * btc * sizeof(uint16_t);
    int64_t workspace = 0;
    for (const auto& [key, plan] : sdpa_plans_) {
      workspace = std::max(workspace, plan->workspace_bytes);
    }
    wanted[kSdpaWorkspace] = static_cast<size_t>(workspace);
  } else if (NH > 0) {
    const size_t probabilities = ProbabilitiesNumel(B, T, NH);
    wanted[kAttentionHeads] = 4 * btc * sizeof(float);
    wanted[kAttentionGrads] = 3 * btc * sizeof(float);
    wanted[kScoreGrads] = probabilities * sizeof(float);
    if (bf16_) {
      wanted[kAttentionWide] = KernelAttentionWideFloats(btc) * sizeof(float);
      // The products' fp32 operands rounded per call (BatchedGemm): heads
      // of hs rows and probability blocks of T rows, each column padded to
      // 8 elements (Operand), all heads at once.
      const size_t hs = static_cast<size_t>(C / NH);
      auto padded = [](size_t elements, size_t rows) {
        return elements / rows *
               static_cast<size_t>(BfloatLeadingDimension(static_cast<int>(rows))) *
               sizeof(uint16_t);
      };
      const size_t side = std::max(padded(btc, hs), padded(probabilities, static_cast<size_t>(T)));
      wanted[kOperandA] = side;
      wanted[kOperandB] = side;
    }
  }
  return absl::OkStatus();
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
    CudnnAttentionBackward(dqkv, dout, qkv, state, B, T, C, NH);
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
  Bf16* out;
  float* stats;
};

StateParts PartsOf(void* base, const sdpa::StateLayout& layout) {
  char* bytes = static_cast<char*>(base);
  return StateParts{reinterpret_cast<Bf16*>(bytes + layout.out_bytes),
                    reinterpret_cast<float*>(bytes + layout.stats_bytes)};
}

}  // namespace

// cuDNN runs in precision bf16 only (InitAttention), so the activations are
// bf16 here and CheckedActivation<Bf16> holds them to it.
void CudaBackend::CudnnAttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B,
                                        int T, int C, int NH) {
  const sdpa::Shape shape = SdpaShape(B, T, C, NH);
  const sdpa::StateLayout layout = sdpa::StateLayoutOf(shape);
  const size_t btc = Mul(Mul(B, T), C);
  Bf16* y = CheckedActivation<Bf16>(out, btc, "attention out");
  float* saved = CheckedF32(state, layout.numel(), "attention state");
  const Bf16* x = CheckedActivation<const Bf16>(qkv, 3 * btc, "qkv");
  if (!Begin()) return;
  const sdpa::Plan* plan = SdpaPlanFor(shape, sdpa::Direction::kForward);
  if (plan == nullptr) return;
  void* workspace = nullptr;
  if (plan->workspace_bytes > 0) {
    workspace = Scratch(kSdpaWorkspace, static_cast<size_t>(plan->workspace_bytes));
    if (workspace == nullptr) return;
  }
  const StateParts parts = PartsOf(saved, layout);
  if (absl::Status run = sdpa::ExecuteForward(*cudnn_, cudnn_handle_, *plan, shape,
                                              {x, y, parts.stats}, workspace);
      !run.ok()) {
    Fail(std::move(run));
    return;
  }
  Check(cudaMemcpyAsync(parts.out, y, btc * sizeof(Bf16), cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync (attention output into the state)");
}

void CudaBackend::CudnnAttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv,
                                         TensorSpan state, int B, int T, int C, int NH) {
  const sdpa::Shape shape = SdpaShape(B, T, C, NH);
  const sdpa::StateLayout layout = sdpa::StateLayoutOf(shape);
  const size_t btc = Mul(Mul(B, T), C);
  Bf16* dx = CheckedActivation<Bf16>(dqkv, 3 * btc, "dqkv");
  const Bf16* dy = CheckedActivation<const Bf16>(dout, btc, "attention dout");
  const Bf16* x = CheckedActivation<const Bf16>(qkv, 3 * btc, "qkv");
  float* saved = CheckedF32(state, layout.numel(), "attention state");
  if (!Begin()) return;
  const sdpa::Plan* plan = SdpaPlanFor(shape, sdpa::Direction::kBackward);
  if (plan == nullptr) return;
  auto* grads = static_cast<Bf16*>(Scratch(kSdpaGrads, 3 * btc * sizeof(Bf16)));
  if (grads == nullptr) return;
  void* workspace = nullptr;
  if (plan->workspace_bytes > 0) {
    workspace = Scratch(kSdpaWorkspace, static_cast<size_t>(plan->workspace_bytes));
    if (workspace == nullptr) return;
  }
  const StateParts parts = PartsOf(saved, layout);
  if (absl::Status run = sdpa::ExecuteBackward(*cudnn_, cudnn_handle_, *plan, shape,
                                               {x, parts.out, parts.stats, dy, grads}, workspace);
      !run.ok()) {
    Fail(std::move(run));
    return;
  }
  cuda::AddBf16(dx, grads, static_cast<int64_t>(3 * btc), stream_);  // the += contract
  CheckLaunch("AddBf16 (dqkv)");
}

}  // namespace cohort::compute::cuda_impl
