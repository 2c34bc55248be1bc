#pragma once
// A job's loss curve as the coordinator keeps it (v1::LossHistory): points
// in ascending step order, bounded in number by thinning.
//
// A point for a step at or below the newest replaces the points from that
// step on: a generation that resumed from an older state trains those steps
// again, and the curve shows the run that continued. When a series exceeds
// its bound, every other point between the first and the newest is
// dropped, so the curve keeps its shape at half the resolution (older
// stretches end up thinned more often than recent ones).
//
// Pure functions; thread-compatible.

#include <cstdint>

#include "cohort/v1/job.pb.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace cohort::coordinator {

// Points per series of a job's history.
inline constexpr int kMaxLossHistoryPoints = 1000;

using LossSeries = google::protobuf::RepeatedPtrField<v1::LossPoint>;

// Adds (step, loss) to `series` as described above.
void AddLossPoint(LossSeries* series, int64_t step, double loss,
                  int max_points = kMaxLossHistoryPoints);

// Adds the points of `reported` (a worker's recent validations, oldest
// first) that are newer than the newest in `series`; returns whether any was.
bool MergeNewerPoints(LossSeries* series, const LossSeries& reported,
                      int max_points = kMaxLossHistoryPoints);

}  // namespace cohort::coordinator
