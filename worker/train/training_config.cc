#include "worker/train/training_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec/validator.h"
#include "common/layout/mesh_layout.h"
#include "common/status_macros.h"

namespace cohort::train {
namespace {

compute::Precision PrecisionOf(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_TF32:
      return compute::Precision::kTf32;
    case v1::PRECISION_BF16:
      return compute::Precision::kBf16;
    default:
      return compute::Precision::kFp32;
  }
}

}  // namespace

absl::StatusOr<TrainingConfig> TrainingConfigFromSpec(const v1::JobSpec& input,
                                                      std::vector<int> micro_batch_shares) {
  // The one validator and its defaults (common/job_spec/validator.h): a spec
  // from the coordinator is normalised already (normalising again changes
  // nothing), one built by a tool or test is filled in here. Below, nothing
  // applies a default or re-checks a rule of its own.
  ASSIGN_OR_RETURN(const v1::JobSpec spec, NormalizeJobSpec(input));
  TrainingConfig config;
  config.backend = spec.device_kind() == v1::DEVICE_KIND_GPU ? compute::BackendKind::kCuda
                                                              : compute::BackendKind::kCpu;
  config.precision = PrecisionOf(spec.model().precision());
  const v1::ModelConfig& m = spec.model();
  config.model.layers = m.layers();
  config.model.heads = m.heads();
  config.model.width = m.width();
  config.model.vocab_size = m.vocab_size();
  config.model.context_length = m.context_length();
  // The engine's own limits (the validator's bounds are within them: a
  // failure here is a defect, reported as one).
  if (absl::Status s = config.model.Validate(); !s.ok()) {
    return absl::InternalError(absl::StrCat("model of a validated spec: ", s.message()));
  }
  config.init_seed = m.init_seed();

  config.global_batch_size = spec.batch().global_batch_size();
  config.micro_batch_size = spec.batch().micro_batch_size();
  config.zero1 = spec.parallelism().zero1();
  config.deterministic_reduction =
      spec.parallelism().reduction() != v1::ParallelismConfig::REDUCTION_TRANSPORT;
  // The one rule that depends on the generation, not the spec: the plan's
  // split must be one of the spec's micro-batches.
  config.micro_batch_shares = std::move(micro_batch_shares);
  if (!layout::SharesFit(config.shares(), config.micro_batches_per_step(),
                         !config.deterministic_reduction)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mesh.micro_batches: the split ", absl::StrJoin(config.shares(), "+"), " is not ",
        config.micro_batches_per_step(), " micro-batches per step with at least one on each "
        "data rank", config.deterministic_reduction ? "" : " and the same on each (transport)"));
  }
  config.steps = spec.steps();

  const v1::OptimizerConfig& o = spec.optimizer();
  config.lr.max_lr = o.learning_rate();
  config.lr.min_lr = o.min_learning_rate();
  config.lr.warmup_steps = o.warmup_steps();
  config.lr.total_steps = config.steps;
  if (absl::Status s = ValidateLrSchedule(config.lr); !s.ok()) {
    return absl::InternalError(absl::StrCat("optimizer of a validated spec: ", s.message()));
  }
  config.adamw.beta1 = o.beta1();
  config.adamw.beta2 = o.beta2();
  config.adamw.eps = o.epsilon();
  config.adamw.weight_decay = o.weight_decay();
  config.grad_clip = o.grad_clip();

  const v1::DataConfig& d = spec.data();
  config.data.sample_seed = d.seed();
  if (d.has_synthetic()) {
    const v1::SyntheticSource& s = d.synthetic();
    config.data.synthetic = true;
    config.data.markov.seed = s.seed();
    config.data.markov.vocab_size = m.vocab_size();
    config.data.markov.alphabet_size = s.alphabet_size();
    config.data.markov.branching = s.branching();
    config.data.markov.order = s.order();
    config.data.synthetic_tokens = s.tokens();
  } else {
    config.data.pattern = d.shards().pattern();
  }
  if (d.has_validation()) {
    const v1::ValidationConfig& v = d.validation();
    config.data.validation_pattern = v.pattern();
    config.data.held_out_fraction = v.held_out_fraction();
    config.validation_interval = v.interval_steps();
    config.validation_batches = v.batches();
  }
  return config;
}

absl::StatusOr<Datasets> LoadDatasets(const DataSourceConfig& config) {
  auto load_source = [&]() -> absl::StatusOr<data::TokenDataset> {
    if (config.synthetic) {
      absl::StatusOr<data::MarkovSource> source = data::MarkovSource::Create(config.markov);
      if (!source.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.synthetic: ", source.status().message()));
      }
      return data::TokenDataset::FromTokens(
          source->Generate(config.synthetic_tokens, data::kTrainStream), "synthetic");
    }
    return data::TokenDataset::OpenGlob(config.pattern);
  };
  ASSIGN_OR_RETURN(data::TokenDataset source, load_source());
  Datasets datasets;
  if (config.held_out_fraction > 0) {
    absl::StatusOr<data::TokenDataset::Split> split =
        data::TokenDataset::HoldOutTail(std::move(source), config.held_out_fraction);
    if (!split.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.validation.held_out_fraction: ", split.status().message()));
    }
    datasets.train = std::make_shared<const data::TokenDataset>(std::move(split->kept));
    datasets.validation = std::make_shared<const data::TokenDataset>(std::move(split->held_out));
    return datasets;
  }
  datasets.train = std::make_shared<const data::TokenDataset>(std::move(source));
  if (!config.validation_pattern.empty()) {
    absl::StatusOr<data::TokenDataset> validation =
        data::TokenDataset::OpenGlob(config.validation_pattern);
    if (!validation.ok()) {
      return absl::Status(validation.status().code(),
                          absl::StrCat("data.validation.pattern: ", validation.status().message()));
    }
    datasets.validation = std::make_shared<const data::TokenDataset>(*std::move(validation));
  }
  return datasets;
}

}  // namespace cohort::train
