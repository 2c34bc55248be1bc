#pragma once
// CudaBackend: compute::Backend on one NVIDIA GPU (built where nvcc exists;
// cuda_backend*.cc over cuda_backend_impl.h, cuda_kernels_*.cu). Every op is enqueued on the
// backend's own stream; the matmuls are cuBLASLt's; attention is cuDNN's
// fused flash attention in bf16 where cuDNN loads (loaded at run time, not
// linked: cuda_backend_attention.cc, --fused_attention), else cuBLAS's
// strided batches and kernels; the rest the kernels of cuda_kernels.h. Every
// GEMM's shape (transposes, leading dimensions, batch strides) comes from
// gemm_shapes.h, whose builders the CPU tests run through cblas_sgemm in
// column-major form. Where cuBLASLt's heuristic offers no usable algorithm
// for a shape (none, or none whose state is success: odd alignments), that
// shape runs through cublasGemmEx with the same types, logged once.
//
// Precision of the matmuls and attention's products: fp32 (IEEE products),
// tf32 (the tensor cores' 10-bit mantissa inputs, fp32 accumulation) or
// bf16 (bf16 operands, fp32 accumulation: PyTorch autocast's arithmetic).
// Storage (backend.h, "Activation storage"): in fp32 and tf32 everything is
// fp32 (activation_dtype() kFloat32). In bf16 the activations are stored in
// bf16 (activation_dtype() kBFloat16), which halves their memory and
// traffic: every kernel widens what it reads, computes in fp32 and rounds
// each store once (kernel_math.h, bf16_math.h); the GEMMs read the bf16
// activations directly, the weights from their bf16 working copy
// (AttachParams; an fp32 operand outside it is rounded per call, into
// scratch, its columns padded to 16 bytes), and write bf16 activations
// from their fp32 accumulators (beta 1 where they accumulate) and fp32
// parameter gradients; cuDNN's attention reads and writes the bf16
// activations in place. Parameters, their gradients, the statistics and
// the optimizer's state stay fp32, the cross-entropy's sums double.
// The GEMMs' math is pinned against the environment (cuda_backend_gemm.cc,
// PinGemmMath): fp32 computes with
// CUBLAS_COMPUTE_32F_PEDANTIC (cuBLAS's handle in CUBLAS_PEDANTIC_MATH),
// which neither NVIDIA_TF32_OVERRIDE nor cuBLAS's fp32 emulation can turn
// into TF32 or anything else; tf32 is refused at creation where
// NVIDIA_TF32_OVERRIDE is set to anything but 1 (0 would silently compute
// it in fp32); bf16 operands are not fp32, so neither reaches their
// CUBLAS_COMPUTE_32F products.
//
// Memory: with arena_bytes > 0 the backend reserves that much device memory
// once, at creation (ResourceExhausted there when the device lacks it), and
// Allocate carves buffers from it (device_arena.h), refusing what does not
// fit. A training session reserves its estimate instead, before its model
// allocates (ReserveDeviceMemory, TrainingSession::EstimateDeviceBytes): a
// session too large fails when it is built, not mid-step, and what an
// estimate that fell short leaves out comes from cudaMalloc, logged once.
// Without either every Allocate is a cudaMalloc. ResourceExhausted from Allocate names the bytes
// wanted and the bytes free. Scratch the ops need (attention's head-major copies and score
// gradients, sort and column-sum space) is kept between calls, from the same memory: ReserveScratch
// takes it for the largest passes up front (GptModel::Create does, so a model too big fails when it
// is built); beyond that it grows on demand, and when it cannot, the op is skipped and
// Synchronize() reports ResourceExhausted.
//
// Errors: ops are asynchronous. The first failure (a launch, a cuBLAS call,
// a device fault) is kept, later ops are skipped, and Synchronize() returns
// it (Internal, or ResourceExhausted for memory) and clears it. Calls that
// return a status themselves (Allocate, AllocateHost, ReserveScratch)
// return a pending failure too, and leave it pending; what they refuse for
// their own request (memory that is not there) is returned, not kept.
//
// Creation refuses (FailedPrecondition) a device that no kernel image of the
// binary runs on, naming its compute capability and the architectures built
// (gpu_architectures.h).
// CopyFromHost and CopyToHost return only when the copy is done, like the
// CPU backend's, so host buffers may be reused or read at once.
//
// Determinism: bitwise reproducible run to run on the same GPU and library
// versions: no atomics in any accumulation, every reduction in a fixed order
// (gpu_launch_plan.h), one cuBLASLt algorithm per GEMM shape and operand
// alignment chosen once and kept (the heuristic's first usable result, or
// cublasGemmEx where it has none), split-K reductions in place excluded,
// cuBLAS's workspace pinned. The model's activation views start on 256
// bytes (gpt_activations.h), cuBLASLt's default assumption.
//
// Thread-safety: thread-compatible, like every Backend; each call makes the
// backend's device current on the calling thread.

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/compute/backend_factory.h"

namespace cohort::compute {

struct CudaBackendOptions {
  // The CUDA device (cudaSetDevice index). >= 0.
  int device_index = 0;
  // kFp32, kTf32 or kBf16 (see Precision above).
  Precision precision = Precision::kFp32;
  // Device memory reserved up front for Allocate; 0: allocate on demand.
  size_t arena_bytes = 0;
  // Attention through cuDNN's fused flash attention or the kernels
  // (backend_factory.h; cuda_backend_attention.cc).
  FusedAttention fused_attention = FusedAttention::kAuto;
};

// FailedPrecondition when there is no usable CUDA device at device_index,
// or none of this build's CUDA architectures runs on it;
// or for precision tf32 under NVIDIA_TF32_OVERRIDE (see Precision above);
// InvalidArgument for a negative index;
// ResourceExhausted when the arena cannot be reserved; Internal when CUDA,
// cuBLAS or cuBLASLt cannot be initialised.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

}  // namespace cohort::compute
