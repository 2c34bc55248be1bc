#pragma once
// Human-readable renderings of checkpoints for cohortctl. Pure functions,
// thread-safe.

#include <cstdint>
#include <string>

#include "cohort/v1/checkpoints.pb.h"

namespace cohort::cohortctl {

// "1.50 GB", "12.3 MB", "512 B" (powers of 1000).
std::string FormatBytes(uint64_t bytes);

// "2x2x1" or "2x2x1 zero1".
std::string CheckpointLayoutLabel(const v1::CheckpointLayout& layout);

// Table of a job's checkpoints: STEP, GENERATION, LAYOUT, TENSORS, CHUNKS,
// SIZE, COMMITTED (UTC).
std::string FormatCheckpointTable(const v1::ListCheckpointsResponse& response);

// A manifest: job, step, generation, layout, size, commit time, objects,
// then the tensors (TENSOR, SHAPE, CHUNKS, SIZE, WRITERS).
std::string FormatManifest(const v1::CheckpointManifest& manifest);

}  // namespace cohort::cohortctl
