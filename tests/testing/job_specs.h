#pragma once
// A small valid job spec for tests: 2 layers, 4 heads, width 64, vocab 256,
// context 64, synthetic data, global batch 16 in micro-batches of 2 (8
// micro-batches per step, so the data-parallel degree divides 8), 100 steps.

#include <string>

#include "cohort/v1/job.pb.h"

namespace cohort::testing {

// Its micro-batches per step, for the meshes tests plan themselves
// (train::LocalMesh).
inline constexpr int kSmallJobMicroBatches = 8;
inline constexpr int kSmallJobMicroBatchSize = 2;

v1::JobSpec SmallJobSpec(const std::string& name, int tensor, int min_workers, int max_workers);

}  // namespace cohort::testing
