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

void CheckVocabShard(int vocab_start, int Vs) {
  CHECK(vocab_start >= 0 && Vs > 0) << "vocab shard: vocab_start=" << vocab_start << " Vs=" << Vs;
}

}  // namespace cohort::compute
