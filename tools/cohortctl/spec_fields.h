#pragma once
// JobSpec fields named by a path of field names ("optimizer.warmup_steps"),
// read and set by protobuf reflection. This is how each submit flag, declared
// once in the flag table (command_line.cc, FlagDoc::spec_field), reaches the
// spec and shows its default in the help. Pure functions, thread-safe.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cohort/v1/job.pb.h"

namespace cohort::cohortctl {

// The value of the scalar field at `path` as the help shows it: numbers as
// written, enums without their prefix in lower case (DEVICE_KIND_CPU: cpu),
// bools on/off, an empty data.shards.pattern "synthetic". Dies on a path that
// names no scalar field (the table is code, and tested).
std::string SpecFieldText(const v1::JobSpec& spec, absl::string_view path);

// Sets the scalar field at `path` from `value`, the text given to --`flag`,
// creating the messages on the way. InvalidArgument naming the flag when the
// text is not a value of the field's type: integers in range, finite
// numbers, true/false (also 1/0, yes/no), and for an enum one of its values
// in the help's form (e.g. cpu or gpu, any case).
absl::Status SetSpecField(absl::string_view path, absl::string_view flag, absl::string_view value,
                          v1::JobSpec* spec);

}  // namespace cohort::cohortctl
