#include "worker/compute/cpu_activation_staging.h"

#include <cstdint>

#include "common/log.h"
#include "worker/compute/bf16_math.h"
#include "worker/compute/span_checks.h"

namespace cohort::compute::cpu {
namespace {

// Below this many elements a conversion runs on one thread: a team costs
// more than the pass.
constexpr int64_t kParallelElements = int64_t{1} << 15;

void Widen(float* dst, const uint16_t* src, int64_t n, int threads) {
  const int team = n >= kParallelElements ? threads : 1;
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = kernel_math::FloatOfBf16(src[i]);
}

void Round(uint16_t* dst, const float* src, int64_t n, int threads) {
  const int team = n >= kParallelElements ? threads : 1;
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = kernel_math::Bf16Bits(src[i]);
}

bool Overlap(const TensorSpan& a, size_t a_numel, const TensorSpan& b, size_t b_numel) {
  const auto* a_begin = static_cast<const char*>(a.data);
  const auto* b_begin = static_cast<const char*>(b.data);
  return a_begin < b_begin + b_numel * DTypeSize(b.dtype) &&
         b_begin < a_begin + a_numel * DTypeSize(a.dtype);
}

}  // namespace

ActivationStaging::ActivationStaging(DType activation, int threads,
                                     std::vector<std::vector<float>>* scratch)
    : activation_(activation), threads_(threads), scratch_(scratch) {}

ActivationStaging::~ActivationStaging() {
  for (size_t i = 0; i < count_; ++i) {
    const Staged& s = staged_[i];
    if (s.written) {
      Round(static_cast<uint16_t*>(s.span.data), s.fp32, static_cast<int64_t>(s.numel), threads_);
    }
  }
}

const float* ActivationStaging::In(TensorSpan span, size_t numel, const char* what) {
  return Stage(span, numel, what, /*written=*/false);
}

float* ActivationStaging::Out(TensorSpan span, size_t numel, const char* what) {
  return Stage(span, numel, what, /*written=*/true);
}

float* ActivationStaging::OptionalOut(TensorSpan span, size_t numel, const char* what) {
  return span.empty() ? nullptr : Out(span, numel, what);
}

float* ActivationStaging::Stage(TensorSpan span, size_t numel, const char* what, bool written) {
  void* data = CheckedActivation(span, activation_, numel, what);
  if (activation_ == DType::kFloat32) return static_cast<float*>(data);
  for (size_t i = 0; i < count_; ++i) {
    Staged& s = staged_[i];
    if (s.span.data == data) {
      CHECK(s.numel == numel) << what << ": staged with " << numel << " elements and " << s.numel;
      s.written = s.written || written;
      return s.fp32;
    }
    CHECK(!((written || s.written) && Overlap(s.span, s.numel, span, numel)))
        << what << " overlaps another span of the op without being it";
  }
  CHECK(count_ < kMaxSpans) << what << ": more than " << kMaxSpans << " activation spans";
  if (scratch_->size() <= count_) scratch_->resize(count_ + 1);
  std::vector<float>& fp32 = (*scratch_)[count_];
  if (fp32.size() < numel) fp32.resize(numel);
  Widen(fp32.data(), static_cast<const uint16_t*>(data), static_cast<int64_t>(numel), threads_);
  staged_[count_++] = Staged{.span = span, .numel = numel, .fp32 = fp32.data(), .written = written};
  return fp32.data();
}

}  // namespace cohort::compute::cpu
