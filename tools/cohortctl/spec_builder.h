#pragma once
// Builds the JobSpec that `cohortctl submit` sends: from a spec file or the
// demo job, with the spec flags given on the command line laid over it.
// Pure functions, thread-safe.

#include <string>

#include "absl/status/statusor.h"
#include "cohort/v1/job.pb.h"
#include "tools/cohortctl/ctl_config.h"

namespace cohort::cohortctl {

// The demo job: deploy/local/jobs/demo.yaml, compiled in (a 2-layer GPT on a
// synthetic source, data parallel over 2 to 4 CPU workers with ZeRO-1).
v1::JobSpec DemoJobSpec();

// Sets every field of `spec` that `flags` holds. InvalidArgument when --device
// is neither cpu nor gpu. Field values are otherwise checked by the
// coordinator, which owns the rules.
absl::Status ApplySpecFlags(const SpecFlags& flags, v1::JobSpec* spec);

// The spec to submit: the file at `path` (when not empty) or the demo job,
// then the flags. Errors from reading the file keep their "<path>: " prefix.
absl::StatusOr<v1::JobSpec> BuildSubmitSpec(const std::string& path, const SpecFlags& flags);

}  // namespace cohort::cohortctl
