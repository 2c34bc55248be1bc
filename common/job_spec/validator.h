#pragma once
// Job spec validation and defaults. Pure logic.

#include "absl/status/statusor.h"
#include "cohort/v1/job.pb.h"

namespace cohort {

// Returns the spec with defaults filled in (documented beside each field in
// proto/cohort/v1/job.proto) or InvalidArgument listing every problem found,
// each naming the field and the reason, joined by "; ", e.g.
//   "parallelism.tensor: tensor parallel 3 does not divide 8 attention heads (model.heads)".
absl::StatusOr<v1::JobSpec> NormalizeJobSpec(const v1::JobSpec& spec);

// Fills the checkpoint policy's defaults (keep_last) as NormalizeJobSpec
// does: the one place they are applied, for code that holds a policy that
// may not have come through a normalised spec. No validation.
void ApplyCheckpointDefaults(v1::CheckpointPolicy& policy);

// Number of micro-batches per optimizer step of a normalized spec.
int MicroBatchesPerStep(const v1::JobSpec& spec);

}  // namespace cohort
