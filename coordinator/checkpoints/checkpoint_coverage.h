#pragma once
// CheckCoverage: whether a tensor's chunks tile its global shape, every
// element exactly once. The checkpoint commit rule (docs/checkpoint-format.md)
// applies it to every tensor before a manifest becomes visible.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/box.h"

namespace cohort::coordinator {

// OK when every box lies inside `shape`, no two overlap, and together they
// hold product(shape) elements. FailedPrecondition otherwise, naming
// `tensor` and the offending box (outside the shape, overlapping another) or
// the elements missing.
absl::Status CheckCoverage(const std::string& tensor, absl::Span<const int64_t> shape,
                           absl::Span<const Box> boxes);

}  // namespace cohort::coordinator
