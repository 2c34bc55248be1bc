#include "worker/train/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::train {

std::vector<DecayRange> WeightDecayRanges(const model::ParameterTable& table, size_t begin,
                                          size_t end) {
  CHECK(begin <= end && end <= table.num_params())
      << "[" << begin << ", " << end << ") outside " << table.num_params();
  std::vector<DecayRange> ranges;
  for (const model::ParameterInfo& info : table.tensors()) {
    const size_t lo = std::max(begin, info.offset);
    const size_t hi = std::min(end, info.end());
    if (lo >= hi) continue;
    if (!ranges.empty() && ranges.back().end == lo && ranges.back().decay == info.weight_decay) {
      ranges.back().end = hi;
    } else {
      ranges.push_back(DecayRange{lo, hi, info.weight_decay});
    }
  }
  return ranges;
}

absl::Status AdamWUpdate(const AdamWOptions& options, const AdamWSlice& slice,
                         absl::Span<const DecayRange> ranges, double lr, int64_t step) {
  if (step < 1)
    return absl::InvalidArgumentError(absl::StrCat("AdamW step must be >= 1, got ", step));
  if (!std::isfinite(lr) || lr < 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW lr must be finite and >= 0, got ", lr));
  }
  if (slice.count > 0 && (slice.params == nullptr || slice.grads == nullptr || slice.m == nullptr ||
                          slice.v == nullptr)) {
    return absl::InvalidArgumentError("AdamW slice has a null buffer");
  }
  size_t expect = slice.begin;
  for (const DecayRange& r : ranges) {
    if (r.begin != expect || r.end < r.begin) {
      return absl::InvalidArgumentError(absl::StrCat("decay ranges do not tile the slice at ",
                                                     expect, " (range [", r.begin, ", ", r.end,
                                                     "))"));
    }
    expect = r.end;
  }
  if (expect != slice.begin + slice.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("decay ranges end at ", expect, ", the slice at ", slice.begin + slice.count));
  }
  // Scalars in double, cast once to the fp32 the element math uses (as torch
  // does with Python-float hyperparameters).
  const float beta1 = static_cast<float>(options.beta1);
  const float beta2 = static_cast<float>(options.beta2);
  const float one_minus_beta1 = static_cast<float>(1.0 - options.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - options.beta2);
  const double bias_correction1 = 1.0 - std::pow(options.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options.beta2, static_cast<double>(step));
  const float neg_step_size = static_cast<float>(-(lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float eps = static_cast<float>(options.eps);
  const float decay_factor = static_cast<float>(1.0 - lr * options.weight_decay);
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();

  for (const DecayRange& r : ranges) {
    const int64_t lo = static_cast<int64_t>(r.begin - slice.begin);
    const int64_t hi = static_cast<int64_t>(r.end - slice.begin);
    const bool decay = r.decay && options.weight_decay != 0.0;
    float* p = slice.params;
    const float* g = slice.grads;
    float* m = slice.m;
    float* v = slice.v;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = lo; i < hi; ++i) {
      float param = p[i];
      if (decay) param *= decay_factor;
      const float grad = g[i];
      const float m_new = m[i] * beta1 + one_minus_beta1 * grad;
      const float v_new = v[i] * beta2 + one_minus_beta2 * grad * grad;
      const float denom = std::sqrt(v_new) / bias_correction2_sqrt + eps;
      p[i] = param + neg_step_size * (m_new / denom);
      m[i] = m_new;
      v[i] = v_new;
    }
  }
  return absl::OkStatus();
}

}  // namespace cohort::train
