// Fuzz target: job spec files as `cohortctl submit` reads them and the
// coordinator then validates them (common/job_spec/io.h,
// common/job_spec/validator.h).
//
// Input: one selector byte, then the document.
//   selector % 4 == 0  JSON            ParseJobSpec(kJson)
//                   1  YAML            ParseJobSpec(kYaml)
//                   2  autodetected    DetectJobSpecFormat("", text), then parse
//                   3  schema-free     YamlToJson(text, nullptr)
//
// Checks, besides the sanitizers: errors are proper statuses; a spec that
// parses is validated by NormalizeJobSpec, and one that validates
//   - validates again to itself (normalization is idempotent),
//   - has micro-batches per step > 0,
//   - survives ToJson -> ParseJobSpec(kJson) unchanged;
// YamlToJson's output, schema-free or guided, is valid JSON when its bytes
// are UTF-8 (yaml-cpp passes invalid bytes on, and decodes input that looks
// like UTF-16/32 into code points UTF-8 cannot hold; protobuf then refuses
// the text, which is InvalidArgument, not a finding).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "cohort/v1/job.pb.h"
#include "common/job_spec/io.h"
#include "common/job_spec/validator.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/message_differencer.h"

namespace cohort::fuzz {
namespace {

// Clears every singular float or double field that is zero of either sign.
// A spec can hold -0.0 (`grad_clip: -00` is a string to YAML, which
// protobuf reads as -0.0); ToJson prints it as the number -0, which
// protobuf's JSON parser reads as +0.0, unset. -0 and 0 mean the same in
// every spec field.
void ClearZeros(google::protobuf::Message* message) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(*message, &fields);
  for (const FieldDescriptor* field : fields) {
    if (field->is_repeated()) continue;
    if ((field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE &&
         reflection->GetDouble(*message, field) == 0) ||
        (field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT &&
         reflection->GetFloat(*message, field) == 0)) {
      reflection->ClearField(message, field);
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      ClearZeros(reflection->MutableMessage(message, field));
    }
  }
}

// Equal specs (NaN equal to NaN, -0 to 0); otherwise the differences go to
// stderr.
bool SameSpec(v1::JobSpec a, v1::JobSpec b) {
  ClearZeros(&a);
  ClearZeros(&b);
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  std::string report;
  differencer.ReportDifferencesToString(&report);
  if (differencer.Compare(a, b)) return true;
  std::fprintf(stderr, "job spec differences:\n%s", report.c_str());
  return false;
}

void CheckSpec(const v1::JobSpec& spec) {
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(spec);
  CheckHandlerError(normalized.status(), "NormalizeJobSpec");
  if (!normalized.ok()) {
    Require(normalized.status().code() == absl::StatusCode::kInvalidArgument,
            "NormalizeJobSpec failed with a code other than INVALID_ARGUMENT");
    return;
  }
  absl::StatusOr<v1::JobSpec> again = NormalizeJobSpec(*normalized);
  Require(again.ok(), "a normalized job spec does not validate again");
  Require(SameSpec(*again, *normalized), "normalizing a normalized job spec changed it");
  Require(MicroBatchesPerStep(*normalized) > 0,
          "a valid job spec has no micro-batches per step");

  const std::string json = ToJson(*normalized, /*multiline=*/false);
  absl::StatusOr<v1::JobSpec> reparsed = ParseJobSpec(json, JobSpecFormat::kJson);
  Require(reparsed.ok(), "ToJson of a valid job spec does not parse back");
  Require(SameSpec(*reparsed, *normalized), "ToJson -> ParseJobSpec changed a valid job spec");
}

void ParseAndCheck(absl::string_view text, JobSpecFormat format) {
  if (format == JobSpecFormat::kYaml) {
    absl::StatusOr<std::string> json = YamlToJson(text, v1::JobSpec::descriptor());
    CheckHandlerError(json.status(), "YamlToJson(JobSpec)");
    if (json.ok() && IsUtf8(*json) && !IsJson(*json)) {
      std::fprintf(stderr, "JSON: %s\n", json->c_str());
      Require(false, "YamlToJson(JobSpec) produced invalid JSON");
    }
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(text, format);
  CheckHandlerError(spec.status(), "ParseJobSpec");
  if (!spec.ok()) {
    Require(spec.status().code() == absl::StatusCode::kInvalidArgument,
            "ParseJobSpec failed with a code other than INVALID_ARGUMENT");
    return;
  }
  CheckSpec(*spec);
}

}  // namespace
}  // namespace cohort::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cohort::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      fuzz::ParseAndCheck(text, JobSpecFormat::kJson);
      break;
    case 1:
      fuzz::ParseAndCheck(text, JobSpecFormat::kYaml);
      break;
    case 2:
      fuzz::ParseAndCheck(text, DetectJobSpecFormat("", text));
      break;
    case 3: {
      absl::StatusOr<std::string> json = YamlToJson(text, nullptr);
      fuzz::CheckHandlerError(json.status(), "YamlToJson(untyped)");
      if (json.ok() && fuzz::IsUtf8(*json) && !fuzz::IsJson(*json)) {
        std::fprintf(stderr, "JSON: %s\n", json->c_str());
        fuzz::Require(false, "YamlToJson(untyped) produced invalid JSON");
      }
      break;
    }
  }
  return 0;
}
