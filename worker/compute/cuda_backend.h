#pragma once
// CudaBackend: compute::Backend on one NVIDIA GPU (built where nvcc exists;
// cuda_backend.cc, cuda_kernels_*.cu). Every op is enqueued on the
// backend's own stream; the matmuls are cuBLASLt's, attention's products
// cuBLAS's strided batches, the rest the kernels of cuda_kernels.h. Every
// GEMM's shape (transposes, leading dimensions, batch strides) comes from
// gemm_shapes.h, whose builders the CPU tests run through cblas_sgemm in
// column-major form.
//
// Precision of the matmuls and attention's products: fp32 (IEEE products),
// tf32 (the tensor cores' 10-bit mantissa inputs, fp32 accumulation) or
// bf16 (each operand rounded to bf16 just before its GEMM, in scratch, its
// columns padded to 16 bytes; fp32 accumulation and an fp32 result: PyTorch autocast's arithmetic for the
// products, without bf16 storage). Everything else is fp32, the
// cross-entropy's sums double. Activations, parameters and gradients are
// stored in fp32 in every precision (activation_dtype() is kFloat32): bf16
// activation storage, which would halve the activations' memory and
// traffic, is not built.
//
// Memory: with arena_bytes > 0 the backend reserves that much device memory
// once, at creation (ResourceExhausted there when the device lacks it), and
// Allocate carves buffers from it (device_arena.h): a session sized up front
// fails when it is built, not mid-step. With 0 every Allocate is a
// cudaMalloc. ResourceExhausted from Allocate names the bytes wanted and
// the bytes free. Scratch the ops need (attention's head-major copies and
// score gradients, sort and column-sum space) is kept between calls, from
// the same memory: ReserveScratch takes it for the largest passes up front
// (GptModel::Create does, so a model too big fails when it is built);
// beyond that it grows on demand, and when it cannot, the op is skipped and
// Synchronize() reports ResourceExhausted.
//
// Errors: ops are asynchronous. The first failure (a launch, a cuBLAS call,
// a device fault) is kept, later ops are skipped, and Synchronize() returns
// it (Internal, or ResourceExhausted for memory) and clears it.
// CopyFromHost and CopyToHost return only when the copy is done, like the
// CPU backend's, so host buffers may be reused or read at once.
//
// Determinism: bitwise reproducible run to run on the same GPU and library
// versions: no atomics in any accumulation, every reduction in a fixed order
// (gpu_launch_plan.h), one cuBLASLt algorithm per GEMM shape chosen once and
// kept, split-K reductions in place excluded, cuBLAS's workspace pinned.
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
};

// FailedPrecondition when there is no usable CUDA device at device_index;
// InvalidArgument for a negative index;
// ResourceExhausted when the arena cannot be reserved; Internal when CUDA,
// cuBLAS or cuBLASLt cannot be initialised.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

}  // namespace cohort::compute
