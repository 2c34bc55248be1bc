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

// Sets the field of `spec` each of `flags` names (FlagDoc::spec_field), in
// order. InvalidArgument naming the flag when its text is not a value of the
// field's type (spec_fields.h). Whether the values make a valid job is the
// coordinator's to check: it owns the rules.
absl::Status ApplySpecFlags(const SpecFlags& flags, v1::JobSpec* spec);

// The spec to submit: the file at `path` (when not empty) or the demo job,
// then the flags. Errors from reading the file keep their "<path>: " prefix.
absl::StatusOr<v1::JobSpec> BuildSubmitSpec(const std::string& path, const SpecFlags& flags);

}  // namespace cohort::cohortctl
