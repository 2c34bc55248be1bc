#pragma once
// Causal scaled-dot-product attention through cuDNN's graph (backend) API,
// forward and backward, on bf16 q, k, v with fp32 softmax statistics: the
// fused flash-attention engines, which keep neither the scores nor the
// probabilities in memory.
//
// cuDNN 9's native SDPA operation descriptors (CUDNN_BACKEND_OPERATION_SDPA_
// FWD/BWD_DESCRIPTOR) take no causal mask (only a block mask, whose blocks
// cannot express the diagonal), so the graphs are built from the primitive
// operations the fused engines recognise, in the order cuDNN's frontend
// lowers its SDPA node to:
//   forward:  S = Q K^T; S *= scale; S = row >= col ? S : lowest (GEN_INDEX
//             on both axes, CMP_GE, BINARY_SELECT); M = max(S); E = exp(S - M);
//             Z = sum(E); stats = M + log(Z); P = E / Z (bf16); O = P V.
//   backward: D = sum(dO * O) * 1; S as above; P = exp(S - stats);
//             dV = P^T dO; dP = (dO V^T) * 1; dS = (dP - D) * P * scale;
//             dK = dS^T Q; dQ = dS K.
// dQ is written by its product directly (no fp32 dQ accumulator): that is
// the frontend's "workspace" variant, the one it forces for a deterministic
// backward. Every view is a strided view of the caller's memory
// (sdpa_layout.h); no transposes.
//
// Engine choice: heuristics mode A, in its order, skipping every engine
// config whose numerical notes say NONDETERMINISTIC and every one whose plan
// does not finalize; the first left is kept for the shape (one plan per
// shape and direction), so repeated runs take the same kernels.
//
// Thread-safety: thread-compatible (one per backend).

#include <cudnn_graph.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/compute/cuda_cudnn_library.h"
#include "worker/compute/sdpa_layout.h"

namespace cohort::compute::sdpa {

// The unique ids of the graphs' non-virtual tensors (the variant pack's).
enum Uid : int64_t {
  kUidQ = 1,
  kUidK = 2,  // as K^T, (B,NH,hs,T)
  kUidV = 3,  // forward as V, backward as V^T
  kUidO = 4,
  kUidStats = 5,
  kUidScale = 6,
  kUidLowest = 7,
  kUidOne = 8,
  kUidDO = 9,
  kUidDQ = 10,
  kUidDK = 11,
  kUidDV = 12,
  kFirstVirtualUid = 100,
};

// Owns one cuDNN backend descriptor.
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(const CudnnLibrary* library, cudnnBackendDescriptor_t raw)
      : library_(library), raw_(raw) {}
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept { *this = std::move(other); }
  Descriptor& operator=(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return raw_; }

 private:
  const CudnnLibrary* library_ = nullptr;
  cudnnBackendDescriptor_t raw_ = nullptr;
};

enum class Direction { kForward, kBackward };

// The finalized tensor and operation descriptors of one graph, in the order
// of the operations. Built without a handle or a device.
struct OperationSet {
  std::vector<Descriptor> owned;              // tensors and op descriptors
  std::vector<cudnnBackendDescriptor_t> ops;  // the operations, in order
};

// The operations of the forward or backward graph for `shape`.
// InvalidArgument for a shape UnsupportedReason refuses; Internal naming the
// descriptor and cuDNN's message when cuDNN refuses an attribute.
absl::StatusOr<OperationSet> BuildOperations(const CudnnLibrary& library, const Shape& shape,
                                             Direction direction);

// The operation graph of `operations`, finalized. `handle` may be null:
// cuDNN 9.19 finalizes a graph without one (its structure: every virtual
// tensor produced and consumed, the operands' shapes), which the CPU tests
// use; heuristics and plans need the handle.
absl::StatusOr<Descriptor> BuildGraph(const CudnnLibrary& library, cudnnHandle_t handle,
                                      const OperationSet& operations);

// A finalized execution plan for one shape and direction.
struct Plan {
  OperationSet operations;
  Descriptor graph;
  Descriptor plan;
  int64_t workspace_bytes = 0;
  std::string engine;  // for logs: "engine 8 (of 3 configs tried)"
};

// The graph over `handle`, its heuristics and the first deterministic
// engine config whose plan finalizes. NotFound when none does (with the
// reasons), Internal for other cuDNN failures.
absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(const CudnnLibrary& library,
                                                cudnnHandle_t handle, const Shape& shape,
                                                Direction direction);

// The device pointers of one execution.
struct ForwardArgs {
  const void* qkv_bf16;  // (B,T,3C)
  void* out_bf16;        // (B,T,C)
  float* stats;          // (B,NH,T)
};
struct BackwardArgs {
  const void* qkv_bf16;   // (B,T,3C)
  const void* out_bf16;   // (B,T,C)
  const float* stats;     // (B,NH,T)
  const void* dout_bf16;  // (B,T,C)
  void* dqkv_bf16;        // (B,T,3C), written
};

// Enqueues the plan on the handle's stream. Internal with cuDNN's message.
absl::Status ExecuteForward(const CudnnLibrary& library, cudnnHandle_t handle, const Plan& plan,
                            const Shape& shape, const ForwardArgs& args, void* workspace);
absl::Status ExecuteBackward(const CudnnLibrary& library, cudnnHandle_t handle, const Plan& plan,
                             const Shape& shape, const BackwardArgs& args, void* workspace);

}  // namespace cohort::compute::sdpa
