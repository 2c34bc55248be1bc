#include "tools/cohortctl/spec_builder.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec_io.h"
#include "common/log.h"
#include "tools/cohortctl/demo_job_yaml.h"

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
  if (flags.name) spec->set_name(*flags.name);
  if (flags.device) {
    const std::string device = absl::AsciiStrToLower(*flags.device);
    if (device == "cpu") {
      spec->set_device_kind(v1::DEVICE_KIND_CPU);
    } else if (device == "gpu") {
      spec->set_device_kind(v1::DEVICE_KIND_GPU);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--device must be cpu or gpu, not \"", *flags.device, "\""));
    }
  }
  v1::ModelConfig& model = *spec->mutable_model();
  if (flags.layers) model.set_layers(*flags.layers);
  if (flags.heads) model.set_heads(*flags.heads);
  if (flags.width) model.set_width(*flags.width);
  if (flags.vocab) model.set_vocab_size(*flags.vocab);
  if (flags.context) model.set_context_length(*flags.context);
  v1::DataConfig& data = *spec->mutable_data();
  if (flags.data_shards) data.mutable_shards()->set_pattern(*flags.data_shards);
  if (flags.seed) {
    data.set_seed(*flags.seed);
    if (data.has_synthetic()) data.mutable_synthetic()->set_seed(*flags.seed);
  }
  v1::OptimizerConfig& optimizer = *spec->mutable_optimizer();
  if (flags.lr) optimizer.set_learning_rate(*flags.lr);
  if (flags.min_lr) optimizer.set_min_learning_rate(*flags.min_lr);
  if (flags.warmup) optimizer.set_warmup_steps(*flags.warmup);
  if (flags.weight_decay) optimizer.set_weight_decay(*flags.weight_decay);
  if (flags.grad_clip) optimizer.set_grad_clip(*flags.grad_clip);
  if (flags.global_batch) {
    spec->mutable_batch()->set_global_batch_size(*flags.global_batch);
  }
  if (flags.micro_batch) {
    spec->mutable_batch()->set_micro_batch_size(*flags.micro_batch);
  }
  v1::ParallelismConfig& parallelism = *spec->mutable_parallelism();
  if (flags.tensor) parallelism.set_tensor(*flags.tensor);
  if (flags.pipeline) parallelism.set_pipeline(*flags.pipeline);
  if (flags.zero1) parallelism.set_zero1(*flags.zero1);
  if (flags.min_workers) {
    spec->mutable_elastic()->set_min_workers(*flags.min_workers);
  }
  if (flags.max_workers) {
    spec->mutable_elastic()->set_max_workers(*flags.max_workers);
  }
  if (flags.steps) spec->set_steps(*flags.steps);
  if (flags.checkpoint_interval) {
    spec->mutable_checkpoint()->set_interval_steps(*flags.checkpoint_interval);
  }
  if (flags.keep_last) spec->mutable_checkpoint()->set_keep_last(*flags.keep_last);
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
