#include "worker/compute/span_checks.h"

#include "common/log.h"

namespace cohort::compute {

float* CheckedF32(TensorSpan span, size_t min_numel, const char* what) {
  CHECK(span.dtype == DType::kFloat32) << what << ": want float32, got " << DTypeName(span.dtype);
  CHECK(span.data != nullptr) << what << ": empty span";
  CHECK(span.numel >= min_numel) << what << ": " << span.numel << " elements, need " << min_numel;
  return static_cast<float*>(span.data);
}

float* OptionalF32(TensorSpan span, size_t min_numel, const char* what) {
  return span.empty() ? nullptr : CheckedF32(span, min_numel, what);
}

const int32_t* CheckedI32(TensorSpan span, size_t min_numel, const char* what) {
  CHECK(span.dtype == DType::kInt32) << what << ": want int32, got " << DTypeName(span.dtype);
  CHECK(span.data != nullptr) << what << ": empty span";
  CHECK(span.numel >= min_numel) << what << ": " << span.numel << " elements, need " << min_numel;
  return static_cast<const int32_t*>(span.data);
}

namespace {

template <typename T>
T* Checked(TensorSpan span, DType dtype, size_t min_numel, const char* what) {
  CHECK(span.dtype == dtype) << what << ": want " << DTypeName(dtype) << ", got "
                             << DTypeName(span.dtype);
  CHECK(span.data != nullptr) << what << ": empty span";
  CHECK(span.numel >= min_numel) << what << ": " << span.numel << " elements, need " << min_numel;
  return static_cast<T*>(span.data);
}

}  // namespace

void* CheckedActivation(TensorSpan span, DType activation, size_t min_numel, const char* what) {
  CHECK(activation == DType::kFloat32 || activation == DType::kBFloat16)
      << what << ": activations of " << DTypeName(activation);
  CHECK(span.dtype == activation) << what << ": an activation, want " << DTypeName(activation)
                                  << ", got " << DTypeName(span.dtype);
  return Checked<void>(span, activation, min_numel, what);
}

void* OptionalActivation(TensorSpan span, DType activation, size_t min_numel, const char* what) {
  return span.empty() ? nullptr : CheckedActivation(span, activation, min_numel, what);
}

double* CheckedF64(TensorSpan span, size_t min_numel, const char* what) {
  return Checked<double>(span, DType::kFloat64, min_numel, what);
}

const int64_t* CheckedI64(TensorSpan span, size_t min_numel, const char* what) {
  return Checked<const int64_t>(span, DType::kInt64, min_numel, what);
}

void CheckCopyWithin(TensorSpan dst, TensorSpan src) {
  CHECK(dst.dtype == src.dtype) << "CopyWithin: " << DTypeName(dst.dtype) << " from "
                                << DTypeName(src.dtype);
  CHECK(src.numel >= dst.numel) << "CopyWithin: " << dst.numel << " elements from " << src.numel;
  if (dst.numel == 0) return;
  CHECK(dst.data != nullptr && src.data != nullptr) << "CopyWithin: empty span";
  const char* d = static_cast<const char*>(dst.data);
  const char* s = static_cast<const char*>(src.data);
  CHECK(d + dst.bytes() <= s || s + dst.bytes() <= d) << "CopyWithin: overlapping spans";
}

size_t CheckedPieceCount(TensorSpan sums, TensorSpan pieces) {
  CheckedF64(sums, 0, "sums");
  CheckedI64(pieces, 0, "pieces");
  CHECK(pieces.numel == 2 * sums.numel)
      << "pieces: " << pieces.numel << " int64, want 2 per sum (" << sums.numel << " sums)";
  return sums.numel;
}

void CheckAdamWRange(TensorSpan params, TensorSpan m, TensorSpan v, TensorSpan grads,
                     TensorSpan scalars, size_t begin, size_t end, size_t moment_base) {
  CHECK(begin <= end && moment_base <= begin)
      << "AdamW range [" << begin << ", " << end << ") from moment " << moment_base;
  CheckedF32(params, end, "params");
  CheckedF32(grads, end, "grads");
  CheckedF32(m, end - moment_base, "m");
  CheckedF32(v, end - moment_base, "v");
  CheckedF64(scalars, 2, "scalars");
}

void CheckVocabShard(int vocab_start, int Vs) {
  CHECK(vocab_start >= 0 && Vs > 0) << "vocab shard: vocab_start=" << vocab_start << " Vs=" << Vs;
}

void CheckNotAnInput(TensorSpan written, std::initializer_list<TensorSpan> inputs,
                     const char* what) {
  for (const TensorSpan& input : inputs) {
    CHECK(written.data != input.data) << what << " may not be an input of the op";
  }
}

void CheckInPlaceOrApart(TensorSpan dlogits, TensorSpan logits) {
  if (dlogits.data == logits.data) return;
  const auto* d = static_cast<const char*>(dlogits.data);
  const auto* l = static_cast<const char*>(logits.data);
  CHECK(d + dlogits.bytes() <= l || l + logits.bytes() <= d)
      << "dlogits overlaps logits without being them";
}

}  // namespace cohort::compute
