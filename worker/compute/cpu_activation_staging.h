#pragma once
// ActivationStaging: how CpuBackend's ops reach their ACTIVATION spans
// (backend.h, "Activation storage"). With fp32 activations it checks each
// span and hands out its own memory, so the fp32 kernels run on it as they
// always did (no copy, the same bits). With bf16 activations (the CPU
// reference of a GPU's bf16 storage, CpuBackendOptions::activation_dtype)
// it widens each span into fp32 scratch (exact) for the op's fp32 kernel to
// run on, and rounds the spans the op writes back to bf16, to nearest even,
// once, when the staging ends. An output is widened too before the kernel
// runs, so an accumulating one (+=) is added to in fp32 and its sum rounded
// once, and an in-place op reads what it overwrites. Spans of one address
// share one scratch (a cross-entropy backward writing dlogits over the
// logits, a residual add into one of its inputs); spans that overlap
// otherwise, one of them written, are refused (CHECK), since their scratch
// copies would not see each other's writes.
//
// One staging per op call, on the stack; the scratch is the backend's, kept
// between calls. Thread-compatible.

#include <array>
#include <cstddef>
#include <vector>

#include "worker/compute/backend.h"

namespace cohort::compute::cpu {

class ActivationStaging {
 public:
  // `activation`: the backend's activation dtype (fp32 or bf16). `scratch`
  // (the backend's, outliving the staging) grows to the spans staged.
  ActivationStaging(DType activation, int threads, std::vector<std::vector<float>>* scratch);
  // Rounds every output back into its span (bf16 only).
  ~ActivationStaging();
  ActivationStaging(const ActivationStaging&) = delete;
  ActivationStaging& operator=(const ActivationStaging&) = delete;

  // The first `numel` elements of an activation span the op only reads, as
  // fp32. `what` names the argument in a failed check.
  const float* In(TensorSpan span, size_t numel, const char* what);
  // The first `numel` elements of an activation span the op writes or adds
  // into (and may read), as fp32; stored back when the staging ends.
  float* Out(TensorSpan span, size_t numel, const char* what);
  // Out for an optional output: nullptr for an empty span.
  float* OptionalOut(TensorSpan span, size_t numel, const char* what);

 private:
  // The most activation spans one op takes (AttentionBackward: dqkv, dout,
  // qkv; MatmulGeluBackward: dpre, dout, act, pre).
  static constexpr size_t kMaxSpans = 6;
  struct Staged {
    TensorSpan span;
    size_t numel = 0;
    float* fp32 = nullptr;
    bool written = false;
  };
  float* Stage(TensorSpan span, size_t numel, const char* what, bool written);

  const DType activation_;
  const int threads_;
  std::vector<std::vector<float>>* const scratch_;
  std::array<Staged, kMaxSpans> staged_;
  size_t count_ = 0;
};

}  // namespace cohort::compute::cpu
