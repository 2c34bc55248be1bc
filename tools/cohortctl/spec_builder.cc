#include "tools/cohortctl/spec_builder.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec/io.h"
#include "common/log.h"
#include "tools/cohortctl/command_line.h"
#include "tools/cohortctl/demo_job_yaml.h"
#include "tools/cohortctl/spec_fields.h"

namespace cohort::cohortctl {

v1::JobSpec DemoJobSpec() {
  static const v1::JobSpec* const demo = [] {
    absl::StatusOr<v1::JobSpec> parsed = ParseJobSpec(kDemoJobYaml, JobSpecFormat::kYaml);
    // The file is in the repository and tested (CohortctlSpecBuilderTest).
    CHECK(parsed.ok()) << "deploy/local/jobs/demo.yaml: " << parsed.status();
    return new v1::JobSpec(*std::move(parsed));
  }();
  return *demo;
}

absl::Status ApplySpecFlags(const SpecFlags& flags, v1::JobSpec* spec) {
  for (const auto& [name, value] : flags) {
    const FlagDoc* flag = FindFlagDoc(name);
    if (flag == nullptr || flag->spec_field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " is not a job spec flag"));
    }
    if (absl::Status s = SetSpecField(flag->spec_field, name, value, spec); !s.ok()) return s;
    // A synthetic source draws from its own seed; --seed means both (a spec
    // file may still give them apart).
    if (absl::string_view(flag->spec_field) == "data.seed" && spec->data().has_synthetic()) {
      spec->mutable_data()->mutable_synthetic()->set_seed(spec->data().seed());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> BuildSubmitSpec(const std::string& path, const SpecFlags& flags) {
  v1::JobSpec spec;
  if (path.empty()) {
    spec = DemoJobSpec();
  } else {
    absl::StatusOr<v1::JobSpec> from_file = ReadJobSpecFile(path);
    if (!from_file.ok()) return from_file.status();
    spec = *std::move(from_file);
  }
  if (absl::Status s = ApplySpecFlags(flags, &spec); !s.ok()) return s;
  return spec;
}

}  // namespace cohort::cohortctl
