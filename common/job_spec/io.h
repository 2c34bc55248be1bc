#pragma once
// Reading job specs from files and printing protos as JSON.
//
// A job spec file is either protobuf's own JSON mapping of cohort.v1.JobSpec
// (field names in lowerCamelCase or snake_case) or YAML with the same field
// names. YAML is turned into a JSON document and parsed by protobuf's JSON
// parser, so both formats share one schema and one set of value rules. The
// YAML walk follows the message descriptor, which lets it report unknown field
// names and shape errors (a map where a number belongs) with a line and
// column, and keep string fields strings (`name: 2024`).
//
// All functions are pure and thread-safe.

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cohort/v1/job.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace cohort {

enum class JobSpecFormat { kJson, kYaml };

// Picks the format from the file extension (.json, .yaml, .yml; any case);
// without a known extension, a document whose first non-blank character is
// '{' is JSON and anything else YAML.
JobSpecFormat DetectJobSpecFormat(absl::string_view path, absl::string_view contents);

// Parses `contents` in `format` into `message`, replacing what it held.
// InvalidArgument (message without a file name) when the text is malformed,
// names an unknown field, or holds a value of the wrong type.
absl::Status ParseMessage(absl::string_view contents, JobSpecFormat format,
                          google::protobuf::Message* message);

// ParseMessage for a JobSpec.
absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view contents, JobSpecFormat format);

// The largest job spec file read: a spec travels in one gRPC request, and no
// honest one comes near this.
inline constexpr size_t kMaxJobSpecFileBytes = 1 << 20;

// Reads and parses the job spec file at `path`. Every error message starts
// with "<path>: ". NotFound or PermissionDenied (from the OS) when the file
// cannot be read; InvalidArgument when it is empty, malformed or larger than
// kMaxJobSpecFileBytes.
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path);

// Converts a YAML document into an equivalent JSON document. With a
// `schema`, the top level must be a map of that message's fields: unknown
// field names and structural mismatches are InvalidArgument with
// "line L, column C: ..." (1-based); without one, any YAML is converted.
absl::StatusOr<std::string> YamlToJson(absl::string_view yaml,
                                       const google::protobuf::Descriptor* schema);

// Protobuf's JSON mapping of `message` (lowerCamelCase names, enums by name,
// zero-valued fields included so scripts find every key). `multiline` pretty
// prints; otherwise the result is a single line. Printing cannot fail for
// Cohort's messages; if it ever does, the result is {"error": "<reason>"}.
std::string ToJson(const google::protobuf::Message& message, bool multiline);

}  // namespace cohort
