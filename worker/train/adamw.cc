#include "worker/train/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/compute/adamw_math.h"

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
  // The scalars in double, cast once to the fp32 the element math uses (as
  // torch does with Python-float hyperparameters); compute/adamw_math.h.
  const compute::AdamWScalars scalars = compute::AdamWScalarsFor(
      options.beta1, options.beta2, options.eps, options.weight_decay, lr, step);
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();

  for (const DecayRange& r : ranges) {
    const int64_t lo = static_cast<int64_t>(r.begin - slice.begin);
    const int64_t hi = static_cast<int64_t>(r.end - slice.begin);
    const bool decay = r.decay;
    float* p = slice.params;
    const float* g = slice.grads;
    float* m = slice.m;
    float* v = slice.v;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = lo; i < hi; ++i) {
      compute::AdamWElement(scalars, decay, g[i], &p[i], &m[i], &v[i]);
    }
  }
  return absl::OkStatus();
}

}  // namespace cohort::train
