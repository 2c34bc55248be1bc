#pragma once
// Box <-> cohort.v1.Box (checkpoint chunks on the wire and in manifests).

#include "cohort/v1/checkpoints.pb.h"
#include "common/box.h"

namespace cohort {

inline Box BoxFromProto(const v1::Box& box) {
  return Box{std::vector<int64_t>(box.start().begin(), box.start().end()),
             std::vector<int64_t>(box.extent().begin(), box.extent().end())};
}

inline void BoxToProto(const Box& box, v1::Box* out) {
  out->Clear();
  for (int64_t s : box.start) out->add_start(s);
  for (int64_t e : box.extent) out->add_extent(e);
}

}  // namespace cohort
