#include "coordinator/checkpoints/checkpoint_coverage.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cohort::coordinator {

absl::Status CheckCoverage(const std::string& tensor, absl::Span<const int64_t> shape,
                           absl::Span<const Box> boxes) {
  const int64_t total =
      std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  int64_t covered = 0;
  for (const Box& box : boxes) {
    if (!BoxWithin(box, shape)) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", tensor, ": chunk ", BoxToString(box), " lies outside its shape [",
                       absl::StrJoin(shape, ", "), "]"));
    }
    covered += box.NumElements();
  }
  // Overlaps: sweep over dimension 0, comparing each box only with earlier
  // ones whose dimension-0 interval is still open.
  if (!shape.empty()) {
    std::vector<const Box*> order;
    for (const Box& box : boxes) {
      if (!box.empty()) order.push_back(&box);
    }
    std::sort(order.begin(), order.end(),
              [](const Box* a, const Box* b) { return a->start < b->start; });
    std::vector<const Box*> open;
    for (const Box* box : order) {
      const int64_t begin = box->start[0];
      std::erase_if(open, [begin](const Box* o) { return o->start[0] + o->extent[0] <= begin; });
      for (const Box* other : open) {
        if (Intersect(*other, *box).has_value()) {
          return absl::FailedPreconditionError(absl::StrCat("tensor ", tensor, ": chunk ",
                                                            BoxToString(*box), " overlaps chunk ",
                                                            BoxToString(*other)));
        }
      }
      open.push_back(box);
    }
  } else if (boxes.size() > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", tensor, ": ", boxes.size(), " chunks of a scalar"));
  }
  if (covered != total) {
    return absl::FailedPreconditionError(absl::StrCat("tensor ", tensor, ": chunks cover ", covered,
                                                      " of its ", total, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace cohort::coordinator
