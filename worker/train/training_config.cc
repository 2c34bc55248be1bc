#include "worker/train/training_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/job_spec_defaults.h"
#include "common/layout/mesh_layout.h"
#include "common/status_macros.h"

namespace cohort::train {
namespace {

// Defaults the coordinator fills in; repeated for specs built by hand
// (tests, tools) that skipped normalisation.
double OrDefault(double value, double fallback) { return value == 0.0 ? fallback : value; }

// A GPU job's precision; unspecified is bf16, the GPU default (the
// coordinator's validator fills it in; a spec built by hand may not).
compute::Precision GpuPrecision(const v1::JobSpec& spec) {
  switch (spec.model().precision()) {
    case v1::PRECISION_FP32:
      return compute::Precision::kFp32;
    case v1::PRECISION_TF32:
      return compute::Precision::kTf32;
    default:
      return compute::Precision::kBf16;
  }
}

}  // namespace

absl::StatusOr<TrainingConfig> TrainingConfigFromSpec(const v1::JobSpec& spec, int dp) {
  TrainingConfig config;
  if (spec.device_kind() == v1::DEVICE_KIND_GPU) {
    config.precision = GpuPrecision(spec);
    config.backend = compute::BackendKind::kCuda;
  } else {
    // The CPU backend computes in fp32 (unspecified: a spec from before the
    // field, or one built by hand).
    if (spec.model().precision() != v1::PRECISION_FP32 &&
        spec.model().precision() != v1::PRECISION_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.precision: ", v1::Precision_Name(spec.model().precision()),
                       " needs a GPU; the CPU backend trains in PRECISION_FP32"));
    }
    config.precision = compute::Precision::kFp32;
  }
  const v1::ModelConfig& m = spec.model();
  config.model.layers = m.layers();
  config.model.heads = m.heads();
  config.model.width = m.width();
  config.model.vocab_size = m.vocab_size();
  config.model.context_length = m.context_length();
  if (absl::Status s = config.model.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", s.message()));
  }
  config.init_seed = m.init_seed();

  config.global_batch_size = spec.batch().global_batch_size();
  config.micro_batch_size = spec.batch().micro_batch_size();
  if (config.global_batch_size < 1 || config.micro_batch_size < 1 ||
      config.global_batch_size % config.micro_batch_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: global_batch_size ", config.global_batch_size,
        " must be a positive multiple of micro_batch_size ", config.micro_batch_size));
  }
  config.zero1 = spec.parallelism().zero1();
  config.deterministic_reduction =
      spec.parallelism().reduction() != v1::ParallelismConfig::REDUCTION_TRANSPORT;
  // The deterministic reduction splits the micro-batches unevenly where dp
  // does not divide them; the transport's cannot.
  if (!layout::MicroBatchesFit(config.micro_batches_per_step(), dp,
                               !config.deterministic_reduction)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: ", config.micro_batches_per_step(), " micro-batches per step ",
        config.deterministic_reduction ? "are fewer than" : "do not divide over",
        " data parallel degree ", dp));
  }
  config.steps = spec.steps();
  if (config.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("steps: must be >= 1, got ", config.steps));
  }

  const v1::OptimizerConfig& o = spec.optimizer();
  config.lr.max_lr = o.learning_rate();
  config.lr.min_lr = o.min_learning_rate();
  config.lr.warmup_steps = o.warmup_steps();
  config.lr.total_steps = config.steps;
  if (absl::Status s = ValidateLrSchedule(config.lr); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: ", s.message()));
  }
  config.adamw.beta1 = OrDefault(o.beta1(), kDefaultBeta1);
  config.adamw.beta2 = OrDefault(o.beta2(), kDefaultBeta2);
  config.adamw.eps = OrDefault(o.epsilon(), kDefaultEpsilon);
  config.adamw.weight_decay = o.weight_decay();
  config.grad_clip = o.grad_clip();

  const v1::DataConfig& d = spec.data();
  config.data.sample_seed = d.seed();
  switch (d.source_case()) {
    case v1::DataConfig::kSynthetic: {
      const v1::SyntheticSource& s = d.synthetic();
      config.data.synthetic = true;
      config.data.markov.seed = s.seed();
      config.data.markov.vocab_size = m.vocab_size();
      config.data.markov.alphabet_size =
          s.alphabet_size() == 0 ? std::min(kDefaultAlphabet, m.vocab_size()) : s.alphabet_size();
      config.data.markov.branching = s.branching() == 0 ? kDefaultBranching : s.branching();
      config.data.markov.order = s.order() == 0 ? kDefaultSyntheticOrder : s.order();
      config.data.synthetic_tokens = s.tokens() == 0 ? kDefaultSyntheticTokens : s.tokens();
      break;
    }
    case v1::DataConfig::kShards:
      config.data.pattern = d.shards().pattern();
      if (config.data.pattern.empty()) {
        return absl::InvalidArgumentError("data.shards.pattern: must not be empty");
      }
      break;
    case v1::DataConfig::SOURCE_NOT_SET:
      return absl::InvalidArgumentError("data: no source: set data.synthetic or data.shards");
  }
  if (d.has_validation()) {
    const v1::ValidationConfig& v = d.validation();
    if (v.pattern().empty() == (v.held_out_fraction() == 0)) {
      return absl::InvalidArgumentError(
          "data.validation: set exactly one of pattern and held_out_fraction");
    }
    if (!v.pattern().empty() && v.pattern() == config.data.pattern) {
      return absl::InvalidArgumentError(
          "data.validation.pattern: the same as data.shards.pattern (validation data must be "
          "held out of training)");
    }
    if (v.held_out_fraction() != 0 &&
        !(v.held_out_fraction() > 0 && v.held_out_fraction() <= kMaxHeldOutFraction)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.validation.held_out_fraction: must be in (0, ", kMaxHeldOutFraction, "], got ",
          v.held_out_fraction()));
    }
    if (v.interval_steps() < 0 || v.batches() < 0) {
      return absl::InvalidArgumentError(
          "data.validation: interval_steps and batches must be >= 0");
    }
    config.data.validation_pattern = v.pattern();
    config.data.held_out_fraction = v.held_out_fraction();
    config.validation_interval = v.interval_steps();
    config.validation_batches = ValidationBatchesOf(v);
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
