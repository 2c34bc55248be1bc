#pragma once
// The rules an uploaded checkpoint is held to, as pure functions: what an
// upload header must declare, when two writers' declarations agree, which
// names a tensor may have, its element size, and which committed steps
// retention retires. CheckpointUploads (checkpoint_uploads.h) applies them.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cohort/v1/checkpoints.pb.h"
#include "cohort/v1/job.pb.h"

namespace cohort::coordinator {

// Bytes per element of `dtype`; 0 for a dtype checkpoints do not hold.
size_t DTypeBytes(v1::TensorDType dtype);

// OK, or InvalidArgument naming the header field and what is wrong with it
// (ResourceExhausted for more than `max_tensors` tensors).
absl::Status CheckUploadHeader(const v1::UploadHeader& h, int max_tensors);

// Whether two writers of one checkpoint declared the same writers, layout
// and tensors.
bool SameDeclaration(const v1::UploadHeader& a, const v1::UploadHeader& b);

// Whether `name` may name a tensor: 1-128 characters of [A-Za-z0-9_/.-]
// (the header check's rule, so names are safe in keys, logs and files).
bool ValidTensorName(const std::string& name);

// The committed steps `policy` no longer keeps: all but the newest
// keep_last and those that are multiples of keep_every (0: none), in
// ascending order. The policy's defaults are filled first, by the job spec's
// own ApplyCheckpointDefaults (common/job_spec/validator.h).
std::vector<int64_t> StepsToRetire(std::vector<int64_t> committed, v1::CheckpointPolicy policy);

}  // namespace cohort::coordinator
