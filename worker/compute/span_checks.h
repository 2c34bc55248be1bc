#pragma once
// Argument checks every Backend implementation makes before it touches a
// span: the dtype, presence and size an op needs. A wrong span is a
// programmer error (backend.h), so these CHECK rather than return a Status;
// an undersized view would otherwise read or write out of bounds (host
// memory on the CPU, device memory on a GPU, where it shows much later).

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "worker/compute/backend.h"

namespace cohort::compute {

// The pointer behind `span`, after checking that it holds at least
// `min_numel` fp32 elements. `what` names the argument in the failure.
float* CheckedF32(TensorSpan span, size_t min_numel, const char* what);
// Like CheckedF32 for optional arguments: nullptr for an empty span.
float* OptionalF32(TensorSpan span, size_t min_numel, const char* what);
const int32_t* CheckedI32(TensorSpan span, size_t min_numel, const char* what);
// An ACTIVATION span (backend.h, "Activation storage"): the pointer behind
// `span`, after checking that its dtype is `activation` (the backend's
// activation_dtype(): fp32 or bf16), that it is not empty and that it holds
// at least `min_numel` elements.
void* CheckedActivation(TensorSpan span, DType activation, size_t min_numel, const char* what);
// Like CheckedActivation for optional arguments: nullptr for an empty span.
void* OptionalActivation(TensorSpan span, DType activation, size_t min_numel, const char* what);
double* CheckedF64(TensorSpan span, size_t min_numel, const char* what);
const int64_t* CheckedI64(TensorSpan span, size_t min_numel, const char* what);
// The optimizer ops' shared checks (backend.h, "The optimizer step"): the
// piece table's size and the update range against the arenas.
void CheckCopyWithin(TensorSpan dst, TensorSpan src);
size_t CheckedPieceCount(TensorSpan sums, TensorSpan pieces);
void CheckAdamWRange(TensorSpan params, TensorSpan m, TensorSpan v, TensorSpan grads,
                     TensorSpan scalars, size_t begin, size_t end, size_t moment_base);
// A vocab shard: rows (or logit columns) [vocab_start, vocab_start + Vs).
void CheckVocabShard(int vocab_start, int Vs);
// An op's written output is none of its inputs (the fused ops': their
// kernels read an input after writing the output). `what` names the op and
// the output in the failure.
void CheckNotAnInput(TensorSpan written, std::initializer_list<TensorSpan> inputs,
                     const char* what);
// A cross-entropy backward's dlogits is its logits (in place) or lies
// apart from them: a partial overlap would read gradients as logits.
void CheckInPlaceOrApart(TensorSpan dlogits, TensorSpan logits);

}  // namespace cohort::compute
