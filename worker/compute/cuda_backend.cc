// CudaBackend (cuda_backend_impl.h): creation, errors and memory.

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {

CudaBackend::~CudaBackend() {
  cudaSetDevice(options_.device_index);  // the handles and memory belong to it
  if (capturing_) {  // a capture left open: ended (and dropped) before the wait
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (side_stream_ != nullptr) {
    cudaStreamSynchronize(side_stream_);
    cudaStreamDestroy(side_stream_);
  }
  ReleaseAttention();
  for (auto& [shape, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
  }
  for (ScratchBuffer& scratch : scratch_) {
    if (scratch.data != nullptr) RawFree(scratch.data);
  }
  FreeParamCopy();
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (lt_workspace_ != nullptr) cudaFree(lt_workspace_);
  if (blas_workspace_ != nullptr) cudaFree(blas_workspace_);
  if (arena_base_ != nullptr) cudaFree(arena_base_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::Init() {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device (", CudaErrorText(counted), ")"));
  }
  if (options_.device_index >= count) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA device ", options_.device_index,
                                                      " does not exist (", count, " visible)"));
  }
  auto cuda = [](cudaError_t error, const char* what) {
    return error == cudaSuccess
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat(what, ": ", CudaErrorText(error)));
  };
  auto blas = [](cublasStatus_t status, const char* what) {
    return status == CUBLAS_STATUS_SUCCESS
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat(what, ": ", BlasErrorText(status)));
  };
  // A device that no kernel image of this binary runs on would fail every
  // op with cudaErrorNoKernelImageForDevice, one step in; refuse it here.
  cudaDeviceProp properties{};
  RETURN_IF_ERROR(
      cuda(cudaGetDeviceProperties(&properties, options_.device_index), "cudaGetDeviceProperties"));
  const ComputeCapability capability{.major = properties.major, .minor = properties.minor};
  RETURN_IF_ERROR(CheckKernelImageFor(BuiltCudaArchitectures(), options_.device_index,
                                      properties.name, capability));
  RETURN_IF_ERROR(cuda(cudaSetDevice(options_.device_index), "cudaSetDevice"));
  RETURN_IF_ERROR(
      cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  RETURN_IF_ERROR(cuda(cudaMalloc(&lt_workspace_, kWorkspaceBytes), "cudaMalloc (workspace)"));
  RETURN_IF_ERROR(cuda(cudaMalloc(&blas_workspace_, kWorkspaceBytes), "cudaMalloc (workspace)"));
  RETURN_IF_ERROR(blas(cublasLtCreate(&lt_), "cublasLtCreate"));
  RETURN_IF_ERROR(blas(cublasCreate(&blas_), "cublasCreate"));
  RETURN_IF_ERROR(blas(cublasSetStream(blas_, stream_), "cublasSetStream"));
  RETURN_IF_ERROR(
      blas(cublasSetWorkspace(blas_, blas_workspace_, kWorkspaceBytes), "cublasSetWorkspace"));
  RETURN_IF_ERROR(PinGemmMath());
  bf16_ = options_.precision == Precision::kBf16;
  // Kept for builds whose list reaches below 8.0: bf16 tensor-core GEMMs
  // need Ampere.
  if (bf16_ && capability.major < 8) {
    return absl::FailedPreconditionError(
        absl::StrCat("precision bf16 needs a GPU of compute capability 8.0 or newer; CUDA device ",
                     options_.device_index, " (", properties.name, ") is ",
                     CapabilityName(capability), " (use fp32)"));
  }
  operand_type_ = bf16_ ? CUDA_R_16BF : CUDA_R_32F;
  RETURN_IF_ERROR(InitAttention(capability.major));
  if (options_.arena_bytes > 0) {
    RETURN_IF_ERROR(ReserveArena(options_.arena_bytes, /*overflow=*/false));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::ReserveArena(size_t bytes, bool overflow) {
  const size_t capacity = AlignUp(std::max<size_t>(bytes, 1));
  void* base = nullptr;
  const cudaError_t reserved = cudaMalloc(&base, capacity);
  if (reserved != cudaSuccess) {
    cudaGetLastError();  // an out-of-memory is not sticky; clear it
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve a device arena of ", capacity, " bytes on CUDA device ",
                     options_.device_index, ": ", free_bytes, " of ", total_bytes, " bytes free (",
                     CudaErrorText(reserved), ")"));
  }
  arena_base_ = static_cast<char*>(base);
  arena_.emplace(capacity, gpu_plan::kDeviceAlignment);
  arena_overflow_ = overflow;
  return absl::OkStatus();
}

absl::Status CudaBackend::ReserveDeviceMemory(size_t bytes) {
  if (ForbidInCapture("ReserveDeviceMemory")) {
    return absl::FailedPreconditionError("ReserveDeviceMemory in a capture");
  }
  if (!Begin()) return error_;
  if (arena_.has_value()) return absl::OkStatus();  // reserved already
  RETURN_IF_ERROR(ReserveArena(bytes, /*overflow=*/true));
  LOG(INFO) << "CUDA device " << options_.device_index << ": reserved " << arena_->capacity()
            << " bytes for the training session";
  return absl::OkStatus();
}

size_t CudaBackend::ParamCopyBytes(size_t params_numel,
                                   const std::vector<ParamBlock>& blocks) const {
  if (!bf16_) return 0;
  absl::StatusOr<ParamCopyLayout> layout = ParamCopyLayout::Create(params_numel, blocks);
  if (!layout.ok() || layout->blocks().empty()) return 0;
  return AlignUp(layout->copy_numel() * sizeof(uint16_t)) +
         AlignUp(layout->blocks().size() * sizeof(ParamCopyBlock));
}

// ---- Errors -----------------------------------------------------------------

void CudaBackend::Fail(absl::Status status) {
  if (error_.ok()) error_ = std::move(status);
}

void CudaBackend::Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    Fail(absl::InternalError(
        absl::StrCat(what, " on CUDA device ", options_.device_index, ": ", CudaErrorText(error))));
  }
}

void CudaBackend::CheckBlas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    Fail(absl::InternalError(absl::StrCat(what, ": ", BlasErrorText(status))));
  }
}

bool CudaBackend::Begin() {
  if (!error_.ok()) return false;
  // cudaGetDevice reads the thread's current device without the driver
  // call (and context synchronisation) that cudaSetDevice costs; the device
  // changes only when another thread or library switched it.
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != options_.device_index) {
    Check(cudaSetDevice(options_.device_index), "cudaSetDevice");
  }
  return error_.ok();
}

absl::Status CudaBackend::Synchronize() {
  // Synchronising a capturing stream would invalidate the capture.
  if (ForbidInCapture("Synchronize")) {
    return absl::FailedPreconditionError("Synchronize in a capture");
  }
  if (stream_ != nullptr) {
    cudaSetDevice(options_.device_index);
    Check(cudaStreamSynchronize(stream_), "a kernel or copy");
  }
  return std::exchange(error_, absl::OkStatus());
}

// ---- Memory -----------------------------------------------------------------

void* CudaBackend::RawAllocate(size_t bytes, absl::Status* error) {
  if (arena_.has_value()) {
    const std::optional<size_t> offset = arena_->Allocate(bytes);
    if (offset.has_value()) return arena_base_ + *offset;
    if (!arena_overflow_) {
      *error = absl::ResourceExhaustedError(absl::StrCat("device arena of CUDA device ",
                                                         options_.device_index, ": ",
                                                         arena_->DescribeShortfall(bytes)));
      return nullptr;
    }
    // The session's estimate fell short (ReserveDeviceMemory): the memory
    // comes from the device directly, as without a reservation.
    if (!overflow_logged_) {
      overflow_logged_ = true;
      LOG(WARNING) << "CUDA device " << options_.device_index
                   << ": the session's reserved memory is short ("
                   << arena_->DescribeShortfall(bytes) << "); allocating outside it";
    }
  }
  void* data = nullptr;
  const cudaError_t allocated = cudaMalloc(&data, std::max<size_t>(bytes, 1));
  if (allocated != cudaSuccess && allocated != cudaErrorMemoryAllocation) {
    // Not a shortage: an earlier kernel's fault, seen here first. Pending,
    // like every op's failure, for Synchronize.
    Check(allocated, "cudaMalloc");
    *error = error_;
    return nullptr;
  }
  if (allocated != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    *error = absl::ResourceExhaustedError(absl::StrCat(
        bytes, " bytes wanted on CUDA device ", options_.device_index, ", ", free_bytes, " of ",
        total_bytes, " bytes free (", CudaErrorText(allocated), ")"));
    return nullptr;
  }
  return data;
}

bool CudaBackend::InArena(const void* data) const {
  const auto* p = static_cast<const char*>(data);
  return arena_.has_value() && p >= arena_base_ && p < arena_base_ + arena_->capacity();
}

void CudaBackend::RawFree(void* data) {
  if (InArena(data)) {
    // Later allocations of the same range are ordered after every op already
    // issued on the stream, so the range can be handed out at once.
    arena_->Free(static_cast<size_t>(static_cast<char*>(data) - arena_base_));
    return;
  }
  cudaSetDevice(options_.device_index);  // a Buffer may be released from any thread
  cudaFree(data);                        // synchronises the device: nothing still reads it
}

absl::StatusOr<Buffer> CudaBackend::Allocate(DType dtype, size_t numel) {
  if (ForbidInCapture("Allocate")) return absl::FailedPreconditionError("Allocate in a capture");
  if (!Begin()) return error_;
  const size_t bytes = std::max<size_t>(numel * DTypeSize(dtype), 1);
  absl::Status error;
  void* data = RawAllocate(bytes, &error);
  if (data == nullptr) return error;
  Check(cudaMemsetAsync(data, 0, bytes, stream_), "cudaMemsetAsync");
  return Buffer(data, dtype, numel, [this](void* p) { RawFree(p); });
}

absl::StatusOr<Buffer> CudaBackend::AllocateHost(DType dtype, size_t numel) {
  if (ForbidInCapture("AllocateHost")) {
    return absl::FailedPreconditionError("AllocateHost in a capture");
  }
  // A failure pending from earlier ops is returned, like Allocate's, and
  // kept: it is Synchronize's to report and clear (the error model,
  // cuda_backend.h), not this call's.
  if (!Begin()) return error_;
  const size_t bytes = std::max<size_t>(numel * DTypeSize(dtype), 1);
  void* data = nullptr;
  const cudaError_t allocated = cudaHostAlloc(&data, bytes, cudaHostAllocPortable);
  if (allocated == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky
    return absl::ResourceExhaustedError(absl::StrCat("cannot page-lock ", bytes,
                                                     " bytes of host memory for staging (",
                                                     CudaErrorText(allocated), ")"));
  }
  if (allocated != cudaSuccess) {
    // Any other error is the device's (a fault of an earlier kernel that
    // this call is the first to see): pending, like every op's failure.
    Check(allocated, "cudaHostAlloc");
    return error_;
  }
  std::memset(data, 0, bytes);
  return Buffer(data, dtype, numel, [](void* p) { cudaFreeHost(p); });
}

absl::Status CudaBackend::GrowScratch(ScratchSlot slot, size_t bytes) {
  ScratchBuffer& scratch = scratch_[slot];
  if (scratch.bytes >= bytes && scratch.data != nullptr) return absl::OkStatus();
  ++memory_generation_;  // captured ops read the old scratch
  if (scratch.data != nullptr) RawFree(scratch.data);
  scratch = ScratchBuffer{};
  absl::Status error;
  void* data = RawAllocate(bytes, &error);
  if (data == nullptr) {
    if (!absl::IsResourceExhausted(error)) return error;
    return absl::ResourceExhaustedError(absl::StrCat("scratch for an op: ", error.message()));
  }
  scratch = ScratchBuffer{data, bytes};
  return absl::OkStatus();
}

void* CudaBackend::Scratch(ScratchSlot slot, size_t bytes) {
  const ScratchBuffer& held = scratch_[slot];
  if ((held.data == nullptr || held.bytes < bytes) &&
      ForbidInCapture("scratch growing for an op (run the shape once directly first)")) {
    return nullptr;  // the op is skipped; the capture fails
  }
  if (absl::Status grown = GrowScratch(slot, bytes); !grown.ok()) {
    Fail(std::move(grown));  // the op is skipped; Synchronize reports it
    return nullptr;
  }
  return scratch_[slot].data;
}

absl::StatusOr<size_t> CudaBackend::ScratchBytes(const PassShape& shape) {
  if (!Begin()) return error_;
  size_t wanted[kScratchSlots] = {};
  RETURN_IF_ERROR(ScratchWanted(shape, wanted));
  size_t total = 0;
  for (size_t bytes : wanted) total += bytes > 0 ? AlignUp(bytes) : 0;
  return total;
}

absl::Status CudaBackend::ReserveScratch(const PassShape& shape) {
  if (ForbidInCapture("ReserveScratch")) {
    return absl::FailedPreconditionError("ReserveScratch in a capture");
  }
  // As in AllocateHost: a pending failure is returned and left for
  // Synchronize.
  if (!Begin()) return error_;
  size_t wanted[kScratchSlots] = {};
  RETURN_IF_ERROR(ScratchWanted(shape, wanted));
  // A shortage is this call's answer, returned and not left pending; a
  // device failure met on the way stays pending as well (RawAllocate).
  for (int slot = 0; slot < kScratchSlots; ++slot) {
    if (wanted[slot] > 0) {
      RETURN_IF_ERROR(GrowScratch(static_cast<ScratchSlot>(slot), wanted[slot]));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::ScratchWanted(const PassShape& shape, size_t* wanted) {
  const int rows = shape.max_batch * shape.max_seq;
  RETURN_IF_ERROR(ChooseAttention(shape, wanted));  // attention's slots
  if (shape.vocab_rows > 0) {
    wanted[kEncoderSort] = cuda::EncoderBackwardScratchBytes(rows, shape.vocab_rows);
  }
  // Passes of fewer rows can split into more chunks (PlanColumnReduce caps
  // them at 512, reached from 8,192 rows): reserve the most any pass needs.
  wanted[kColumnSums] =
      cuda::ColumnSumScratchFloats(std::min(rows, 8192), shape.max_bias_columns) * sizeof(float);
  // No rounding scratch for the linear layers' GEMMs: in bf16 their
  // activations are bf16 already and their weights come from the working
  // copy (AttachParams). What rounds per call (the kernels' attention
  // products) is reserved by ChooseAttention; a weight outside an attached
  // copy takes its scratch on first use.
  // A bf16 product whose epilogue cuBLASLt refuses is finished from an fp32
  // copy (UnfusedProduct). Which shapes it refuses shows only when they are
  // planned, in the first step, so the room is reserved now: a step must
  // not allocate (nor a captured graph grow scratch). Its widest is a biased
  // output or the fc's pre-activation gradient, both max_bias_columns wide
  // (201 MB at GPT-2's B 16 x T 1024).
  if (bf16_) {
    wanted[kUnfusedProduct] =
        static_cast<size_t>(rows) * static_cast<size_t>(shape.max_bias_columns) * sizeof(float);
  }
  return absl::OkStatus();
}

void CudaBackend::Zero(TensorSpan dst) {
  if (dst.empty() || !Begin()) return;
  Check(cudaMemsetAsync(dst.data, 0, dst.bytes(), stream_), "cudaMemsetAsync");
}

void CudaBackend::CopyFromHost(TensorSpan dst, const void* src) {
  if (dst.numel == 0 || ForbidInCapture("CopyFromHost") || !Begin()) return;
  Check(cudaMemcpyAsync(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (to the device)");
  // The caller may reuse `src` when this returns (backend.h).
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBackend::CopyToHost(void* dst, TensorSpan src) {
  if (src.numel == 0 || ForbidInCapture("CopyToHost") || !Begin()) return;
  Check(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (to the host)");
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

// ---- The weights' working copy ------------------------------------------------

absl::Status CudaBackend::AttachParams(TensorSpan params, const std::vector<ParamBlock>& blocks) {
  CHECK(params.dtype == DType::kFloat32) << "AttachParams: the arena is fp32";
  if (ForbidInCapture("AttachParams")) {
    return absl::FailedPreconditionError("AttachParams in a capture");
  }
  ASSIGN_OR_RETURN(ParamCopyLayout layout, ParamCopyLayout::Create(params.numel, blocks));
  FreeParamCopy();
  ++memory_generation_;  // captured GEMMs read the weights another way now
  // fp32 and tf32 GEMMs read the fp32 weights themselves: nothing to keep.
  if (!bf16_ || layout.blocks().empty()) return absl::OkStatus();
  if (!Begin()) return error_;
  ParamCopy copy{.params = static_cast<const float*>(params.data),
                 .numel = params.numel,
                 .layout = std::move(layout)};
  const size_t copy_bytes = copy.layout.copy_numel() * sizeof(uint16_t);
  const size_t block_bytes = copy.layout.blocks().size() * sizeof(ParamCopyBlock);
  absl::Status error;
  copy.copy = RawAllocate(copy_bytes, &error);
  if (copy.copy == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the weights' bf16 working copy: ", error.message()));
  }
  copy.blocks = RawAllocate(block_bytes, &error);
  if (copy.blocks == nullptr) {
    RawFree(copy.copy);
    return absl::ResourceExhaustedError(
        absl::StrCat("the weights' bf16 working copy: ", error.message()));
  }
  // The padding stays zero, as in the per-call rounding (Operand).
  Check(cudaMemsetAsync(copy.copy, 0, copy_bytes, stream_), "cudaMemsetAsync");
  Check(cudaMemcpyAsync(copy.blocks, copy.layout.blocks().data(), block_bytes,
                        cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (the working copy's blocks)");
  // The host vector is pageable: the copy has read it once this returns,
  // but wait here anyway (once per session) so nothing depends on that.
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  param_copy_ = std::move(copy);
  RefreshParamCopy();
  return error_;
}

cuda::ParamCopyRef CudaBackend::CopyRef() const {
  if (!param_copy_.has_value()) return {};
  return cuda::ParamCopyRef{.copy = static_cast<uint16_t*>(param_copy_->copy),
                            .blocks = static_cast<const ParamCopyBlock*>(param_copy_->blocks),
                            .count = static_cast<int>(param_copy_->layout.blocks().size())};
}

void CudaBackend::RefreshParamCopy() {
  if (!param_copy_.has_value()) return;
  Launch("RefreshParamCopy", [&] {
    cuda::RefreshParamCopy(CopyRef(), param_copy_->params, static_cast<int64_t>(param_copy_->numel),
                           stream_);
  });
}

void CudaBackend::DetachParams(TensorSpan params) {
  ForbidInCapture("DetachParams");  // fails a capture, and detaches all the same
  if (param_copy_.has_value() && params.data == param_copy_->params) FreeParamCopy();
}

void CudaBackend::FreeParamCopy() {
  if (!param_copy_.has_value()) return;
  ++memory_generation_;  // captured GEMMs read the copy
  RawFree(param_copy_->copy);
  RawFree(param_copy_->blocks);
  param_copy_.reset();
}

// The asynchronous copies: no wait (backend.h); the host memory is
// AllocateHost's, page-locked, so the copy engine moves it in stream order.
void CudaBackend::CopyFromHostAsync(TensorSpan dst, const void* src) {
  if (dst.numel == 0 || !Begin()) return;
  Check(cudaMemcpyAsync(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (to the device)");
}

void CudaBackend::CopyToHostAsync(void* dst, TensorSpan src) {
  if (src.numel == 0 || !Begin()) return;
  Check(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (to the host)");
}

}  // namespace cohort::compute::cuda_impl

namespace cohort::compute {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  if (options.device_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_index must be >= 0, got ", options.device_index));
  }
  auto backend = std::make_unique<cuda_impl::CudaBackend>(options);
  RETURN_IF_ERROR(backend->Init());
  return backend;
}

}  // namespace cohort::compute
