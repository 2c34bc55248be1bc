#include "common/job_spec/validator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/enum_names.h"
#include "common/job_spec/defaults.h"
#include "common/job_spec/sharding.h"
#include "common/layout/mesh_layout.h"
#include "common/safe_text.h"

namespace cohort {
namespace {

// Sanity bounds: far above anything this system trains, low enough that
// products of them cannot overflow and typos (an extra zero or two) are caught.
constexpr int32_t kMaxLayers = 1024;
constexpr int32_t kMaxVocab = 1 << 20;
constexpr int32_t kMaxContext = 1 << 20;
constexpr int32_t kMaxWorkers = 100000;
constexpr int kMaxNameLength = 63;
constexpr size_t kMaxPatternLength = 4096;

constexpr int64_t kMaxSyntheticTokens = int64_t{1} << 30;

// Collects "field: reason" messages.
class Errors {
 public:
  void Add(absl::string_view field, absl::string_view reason) {
    messages_.push_back(absl::StrCat(field, ": ", reason));
  }
  bool empty() const { return messages_.empty(); }
  std::string Joined() const { return absl::StrJoin(messages_, "; "); }

 private:
  std::vector<std::string> messages_;
};

bool IsNameChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

void CheckName(const std::string& name, Errors& errors) {
  if (name.empty()) {
    errors.Add("name", "must not be empty; use lowercase letters, digits and '-'");
    return;
  }
  bool ok = name.size() <= kMaxNameLength && IsNameChar(name[0]);
  for (char c : name) ok = ok && (IsNameChar(c) || c == '-');
  if (!ok) {
    errors.Add("name", absl::StrCat(Quoted(name),
                                    " must match [a-z0-9][a-z0-9-]{0,62}: lowercase "
                                    "letters, digits and '-', starting with a letter or "
                                    "digit, at most 63 characters"));
  }
}

// Adds an error unless 1 <= value <= max. Returns whether the value is usable.
bool CheckRange(absl::string_view field, int64_t value, int64_t max, Errors& errors) {
  if (value <= 0) {
    errors.Add(field, absl::StrCat("must be > 0, got ", value));
    return false;
  }
  if (value > max) {
    errors.Add(field, absl::StrCat(value, " exceeds the limit of ", max));
    return false;
  }
  return true;
}

void CheckModel(const v1::ModelConfig& model, Errors& errors, bool& heads_ok, bool& vocab_ok,
                bool& layers_ok) {
  layers_ok = CheckRange("model.layers", model.layers(), kMaxLayers, errors);
  const bool width_ok = CheckRange("model.width", model.width(), kMaxModelWidth, errors);
  heads_ok = CheckRange("model.heads", model.heads(), kMaxModelWidth, errors);
  vocab_ok = CheckRange("model.vocab_size", model.vocab_size(), kMaxVocab, errors);
  CheckRange("model.context_length", model.context_length(), kMaxContext, errors);
  if (width_ok && heads_ok && model.width() % model.heads() != 0) {
    errors.Add("model.heads", absl::StrCat(model.heads(), " attention heads do not divide width ",
                                           model.width(), " (model.width)"));
    heads_ok = false;
  }
}

// model.precision: unspecified is BF16 on GPU and FP32 on CPU; the reduced
// precisions need a GPU's tensor cores.
void CheckPrecision(v1::DeviceKind device, v1::ModelConfig& model, Errors& errors) {
  if (!v1::Precision_IsValid(model.precision())) {
    errors.Add("model.precision", absl::StrCat("unknown value ", static_cast<int>(model.precision()),
                                               "; use FP32, TF32 or BF16"));
    return;
  }
  if (model.precision() == v1::PRECISION_UNSPECIFIED) {
    model.set_precision(device == v1::DEVICE_KIND_GPU ? v1::PRECISION_BF16 : v1::PRECISION_FP32);
    return;
  }
  if (device == v1::DEVICE_KIND_CPU && model.precision() != v1::PRECISION_FP32) {
    errors.Add("model.precision",
               absl::StrCat(ShortEnumName(model.precision()),
                            " needs a GPU job (device_kind GPU); CPU jobs train in FP32"));
  }
}

// Fills the parallel degrees' defaults; false if either is unusable.
bool CheckParallelism(v1::ParallelismConfig& parallelism, const v1::ModelConfig& model,
                      bool heads_ok, bool vocab_ok, bool layers_ok, Errors& errors) {
  if (parallelism.tensor() == 0) parallelism.set_tensor(1);
  if (parallelism.pipeline() == 0) parallelism.set_pipeline(1);
  const bool tensor_ok =
      CheckRange("parallelism.tensor", parallelism.tensor(), kMaxWorkers, errors);
  const bool pipeline_ok =
      CheckRange("parallelism.pipeline", parallelism.pipeline(), kMaxWorkers, errors);
  const int32_t tp = parallelism.tensor();
  const int32_t pp = parallelism.pipeline();
  const int64_t padded_vocab = PaddedVocabulary(model.vocab_size());
  const ShardingCheck sharding =
      CheckSharding(model.heads(), padded_vocab, model.layers(), std::max(1, tp), std::max(1, pp));
  if (tensor_ok && heads_ok && !sharding.tensor_divides_heads) {
    errors.Add("parallelism.tensor", absl::StrCat("tensor parallel ", tp, " does not divide ",
                                                  model.heads(), " attention heads (model.heads)"));
  }
  if (tensor_ok && vocab_ok && !sharding.tensor_divides_vocabulary) {
    errors.Add("parallelism.tensor",
               absl::StrCat("tensor parallel ", tp, " does not divide the padded vocabulary ",
                            padded_vocab, " (model.vocab_size ", model.vocab_size(),
                            " rounded up to a multiple of ", kVocabPadMultiple, ")"));
  }
  if (pipeline_ok && layers_ok && !sharding.pipeline_fits_layers) {
    errors.Add("parallelism.pipeline",
               absl::StrCat("pipeline parallel ", pp, " exceeds ", model.layers(),
                            " layers (model.layers); every stage needs at least one layer"));
  }
  if (!v1::ParallelismConfig::Reduction_IsValid(parallelism.reduction())) {
    errors.Add("parallelism.reduction",
               absl::StrCat("unknown value ", static_cast<int>(parallelism.reduction()),
                            " (REDUCTION_DETERMINISTIC or REDUCTION_TRANSPORT)"));
  } else if (parallelism.reduction() == v1::ParallelismConfig::REDUCTION_UNSPECIFIED) {
    parallelism.set_reduction(v1::ParallelismConfig::REDUCTION_DETERMINISTIC);
  }
  return tensor_ok && pipeline_ok;
}

// Returns the number of micro-batches per step, or 0 if the batch is unusable.
int64_t CheckBatch(const v1::BatchConfig& batch, Errors& errors) {
  const bool global_ok = batch.global_batch_size() > 0;
  const bool micro_ok = batch.micro_batch_size() > 0;
  if (!global_ok) {
    errors.Add("batch.global_batch_size",
               absl::StrCat("must be > 0, got ", batch.global_batch_size()));
  }
  if (!micro_ok) {
    errors.Add("batch.micro_batch_size",
               absl::StrCat("must be > 0, got ", batch.micro_batch_size()));
  }
  if (!global_ok || !micro_ok) return 0;
  if (batch.global_batch_size() % batch.micro_batch_size() != 0) {
    errors.Add("batch.micro_batch_size",
               absl::StrCat(batch.micro_batch_size(), " does not divide global_batch_size ",
                            batch.global_batch_size(), " (batch.global_batch_size)"));
    return 0;
  }
  return batch.global_batch_size() / batch.micro_batch_size();
}

// Adds an error unless value is finite and >= 0 (or > 0 when `positive`).
bool CheckNonNegative(absl::string_view field, double value, bool positive, Errors& errors) {
  if (!std::isfinite(value)) {
    errors.Add(field, absl::StrCat("must be a finite number, got ", value));
    return false;
  }
  if (positive ? value <= 0 : value < 0) {
    errors.Add(field, absl::StrCat("must be ", positive ? "> 0" : ">= 0", ", got ", value));
    return false;
  }
  return true;
}

void CheckBeta(absl::string_view field, double value, Errors& errors) {
  if (!std::isfinite(value) || value < 0 || value >= 1) {
    errors.Add(field, absl::StrCat("must be in [0, 1), got ", value));
  }
}

void CheckOptimizer(v1::OptimizerConfig& opt, int64_t steps, Errors& errors) {
  if (opt.beta1() == 0) opt.set_beta1(kDefaultBeta1);
  if (opt.beta2() == 0) opt.set_beta2(kDefaultBeta2);
  if (opt.epsilon() == 0) opt.set_epsilon(kDefaultEpsilon);
  const bool lr_ok =
      CheckNonNegative("optimizer.learning_rate", opt.learning_rate(), /*positive=*/true, errors);
  if (CheckNonNegative("optimizer.min_learning_rate", opt.min_learning_rate(),
                       /*positive=*/false, errors) &&
      lr_ok && opt.min_learning_rate() > opt.learning_rate()) {
    errors.Add("optimizer.min_learning_rate",
               absl::StrCat(opt.min_learning_rate(), " exceeds learning_rate ", opt.learning_rate(),
                            " (optimizer.learning_rate)"));
  }
  if (opt.warmup_steps() < 0) {
    errors.Add("optimizer.warmup_steps", absl::StrCat("must be >= 0, got ", opt.warmup_steps()));
  } else if (steps > 0 && opt.warmup_steps() > steps) {
    errors.Add("optimizer.warmup_steps", absl::StrCat(opt.warmup_steps(), " exceeds the ", steps,
                                                      " steps of the job (steps)"));
  }
  CheckNonNegative("optimizer.weight_decay", opt.weight_decay(), /*positive=*/false, errors);
  CheckBeta("optimizer.beta1", opt.beta1(), errors);
  CheckBeta("optimizer.beta2", opt.beta2(), errors);
  CheckNonNegative("optimizer.epsilon", opt.epsilon(), /*positive=*/true, errors);
  CheckNonNegative("optimizer.grad_clip", opt.grad_clip(), /*positive=*/false, errors);
}

// A path or glob a worker opens: bounded, printable.
bool IsPathText(const std::string& path) {
  return path.size() <= kMaxPatternLength &&
         std::all_of(path.begin(), path.end(),
                     [](char c) { return static_cast<unsigned char>(c) >= 0x20; });
}

void CheckValidation(v1::ValidationConfig& validation, const v1::DataConfig& data,
                     Errors& errors) {
  const bool pattern = !validation.pattern().empty();
  const double fraction = validation.held_out_fraction();
  if (pattern == (fraction != 0)) {
    errors.Add("data.validation",
               "set exactly one of pattern (held-out shards) and held_out_fraction");
  }
  if (pattern && !IsPathText(validation.pattern())) {
    errors.Add("data.validation.pattern",
               absl::StrCat(Quoted(validation.pattern()), " must be a path glob of at most ",
                            kMaxPatternLength, " bytes without control characters"));
  } else if (pattern && data.has_shards() && validation.pattern() == data.shards().pattern()) {
    errors.Add("data.validation.pattern",
               "is data.shards.pattern: validation data must be held out of training");
  }
  if (fraction != 0 && !(fraction > 0 && fraction <= kMaxHeldOutFraction)) {
    errors.Add("data.validation.held_out_fraction",
               absl::StrCat("must be in (0, ", kMaxHeldOutFraction, "], got ", fraction));
  }
  if (validation.interval_steps() < 0) {
    errors.Add("data.validation.interval_steps",
               absl::StrCat("must be >= 0 (0: only after the last step), got ",
                            validation.interval_steps()));
  }
  if (validation.batches() < 0 || validation.batches() > kMaxValidationBatches) {
    errors.Add("data.validation.batches",
               absl::StrCat("must be in [0, ", kMaxValidationBatches, "] (0 means ",
                            kDefaultValidationBatches, "), got ", validation.batches()));
  }
  if (validation.batches() == 0) validation.set_batches(kDefaultValidationBatches);
}

void CheckData(v1::DataConfig& data, const v1::ModelConfig& model, bool vocab_ok, Errors& errors) {
  switch (data.source_case()) {
    case v1::DataConfig::kSynthetic: {
      v1::SyntheticSource& synthetic = *data.mutable_synthetic();
      if (synthetic.branching() == 0) synthetic.set_branching(kDefaultBranching);
      if (synthetic.alphabet_size() == 0 && vocab_ok) {
        synthetic.set_alphabet_size(std::min(kDefaultAlphabet, model.vocab_size()));
      }
      if (synthetic.tokens() == 0) synthetic.set_tokens(kDefaultSyntheticTokens);
      if (synthetic.order() == 0) synthetic.set_order(kDefaultSyntheticOrder);
      if (synthetic.order() != 1 && synthetic.order() != 2) {
        errors.Add("data.synthetic.order", absl::StrCat("must be 1 or 2, got ", synthetic.order()));
      }
      if (synthetic.alphabet_size() < 0) {
        errors.Add("data.synthetic.alphabet_size",
                   absl::StrCat("must be >= 1, got ", synthetic.alphabet_size()));
      } else if (vocab_ok && synthetic.alphabet_size() > model.vocab_size()) {
        errors.Add("data.synthetic.alphabet_size",
                   absl::StrCat(synthetic.alphabet_size(), " symbols exceed model.vocab_size ",
                                model.vocab_size()));
      }
      if (synthetic.branching() < 0) {
        errors.Add("data.synthetic.branching",
                   absl::StrCat("must be >= 1, got ", synthetic.branching()));
      } else if (synthetic.alphabet_size() > 0 &&
                 synthetic.branching() > synthetic.alphabet_size()) {
        errors.Add("data.synthetic.branching",
                   absl::StrCat(synthetic.branching(), " successors per context exceed ",
                                synthetic.alphabet_size(), " symbols (data.synthetic.alphabet_size)"));
      }
      if (synthetic.tokens() < 0 || synthetic.tokens() > kMaxSyntheticTokens) {
        errors.Add("data.synthetic.tokens", absl::StrCat("must be in [1, ", kMaxSyntheticTokens,
                                                         "], got ", synthetic.tokens()));
      } else if (model.context_length() > 0 && synthetic.tokens() <= model.context_length()) {
        errors.Add("data.synthetic.tokens",
                   absl::StrCat(synthetic.tokens(), " tokens hold no sample of context_length+1 = ",
                                int64_t{model.context_length()} + 1, " tokens"));
      }
      break;
    }
    case v1::DataConfig::kShards:
      if (data.shards().pattern().empty()) {
        errors.Add("data.shards.pattern",
                   "must not be empty; give a glob of .bin token shards visible to every worker");
      } else if (data.shards().pattern().size() > kMaxPatternLength ||
                 !std::all_of(data.shards().pattern().begin(), data.shards().pattern().end(),
                              [](char c) { return static_cast<unsigned char>(c) >= 0x20; })) {
        errors.Add("data.shards.pattern",
                   absl::StrCat(Quoted(data.shards().pattern()), " must be a path glob of at most ",
                                kMaxPatternLength, " bytes without control characters"));
      }
      break;
    case v1::DataConfig::SOURCE_NOT_SET:
      errors.Add("data", "no source: set data.synthetic or data.shards");
      break;
  }
  if (data.has_validation()) CheckValidation(*data.mutable_validation(), data, errors);
}

void CheckElastic(v1::ElasticConfig& elastic, int64_t replica, int64_t micro_batches,
                  bool even_shares, Errors& errors) {
  if (elastic.min_workers() < 0) {
    errors.Add("elastic.min_workers", absl::StrCat("must be >= 0, got ", elastic.min_workers()));
    return;
  }
  if (elastic.max_workers() < 0) {
    errors.Add("elastic.max_workers", absl::StrCat("must be >= 0, got ", elastic.max_workers()));
    return;
  }
  if (elastic.optimizer_replicas() == 0) elastic.set_optimizer_replicas(kDefaultOptimizerReplicas);
  if (elastic.optimizer_replicas() < 1 || elastic.optimizer_replicas() > kMaxOptimizerReplicas) {
    errors.Add("elastic.optimizer_replicas",
               absl::StrCat("must be in [1, ", kMaxOptimizerReplicas, "] (0 means ",
                            kDefaultOptimizerReplicas, "), got ", elastic.optimizer_replicas()));
  }
  if (elastic.wait_for_workers_seconds() < 0) {
    errors.Add("elastic.wait_for_workers_seconds",
               absl::StrCat("must be >= 0 (0 means ", kDefaultWaitForWorkersSeconds,
                            "), got ", elastic.wait_for_workers_seconds()));
  }
  if (elastic.wait_for_workers_seconds() == 0) {
    elastic.set_wait_for_workers_seconds(kDefaultWaitForWorkersSeconds);
  }
  if (replica <= 0) return;  // parallelism already reported
  if (replica > kMaxWorkers) {
    errors.Add("parallelism",
               absl::StrCat("tensor x pipeline needs ", replica,
                            " workers per replica, more than the limit of ", kMaxWorkers));
    return;
  }
  if (elastic.min_workers() == 0) elastic.set_min_workers(static_cast<int32_t>(replica));
  if (elastic.max_workers() == 0) elastic.set_max_workers(elastic.min_workers());
  const int64_t min = elastic.min_workers();
  const int64_t max = elastic.max_workers();
  bool ok = true;
  if (min < replica) {
    errors.Add("elastic.min_workers",
               absl::StrCat(min, " is fewer than the ", replica,
                            " workers of one model replica (parallelism.tensor x "
                            "parallelism.pipeline)"));
    ok = false;
  }
  if (max < min) {
    errors.Add("elastic.max_workers",
               absl::StrCat(max, " is less than min_workers ", min, " (elastic.min_workers)"));
    ok = false;
  } else if (max > kMaxWorkers) {
    errors.Add("elastic.max_workers", absl::StrCat(max, " exceeds the limit of ", kMaxWorkers));
    ok = false;
  }
  if (!ok || micro_batches <= 0) return;
  const int64_t lo = (min + replica - 1) / replica;
  const int64_t hi = max / replica;
  if (lo > hi) {
    errors.Add("elastic",
               absl::StrCat("no worker count from ", min, " to ", max,
                            " (elastic.min_workers to elastic.max_workers) is a multiple of the ",
                            replica, " workers of one model replica (parallelism.tensor x "
                            "parallelism.pipeline); a job runs on whole replicas"));
    return;
  }
  // The planner needs a data-parallel degree that gives every data rank at
  // least one of the step's micro-batches, and with the transport's
  // reduction the same number.
  for (int64_t dp = lo; dp <= hi && dp <= micro_batches; ++dp) {
    if (layout::MicroBatchesFit(micro_batches, dp, even_shares)) return;
  }
  errors.Add("elastic",
             absl::StrCat("no data parallel degree in [", lo, ", ", hi, "] (", min, " to ", max,
                          " workers of ", replica, " per replica) ",
                          even_shares ? "divides the " : "is at most the ", micro_batches,
                          " micro-batches per step (batch.global_batch_size / "
                          "batch.micro_batch_size)",
                          even_shares ? " as parallelism.reduction TRANSPORT needs" : "",
                          "; change the worker bounds or the batch sizes"));
}

void CheckCheckpoint(v1::CheckpointPolicy& checkpoint, Errors& errors) {
  if (checkpoint.interval_steps() < 0) {
    errors.Add("checkpoint.interval_steps",
               absl::StrCat("must be >= 0 (0 disables), got ", checkpoint.interval_steps()));
  }
  ApplyCheckpointDefaults(checkpoint);
  if (checkpoint.keep_last() < 0) {
    errors.Add("checkpoint.keep_last", absl::StrCat("must be >= 0 (0 means ", kDefaultKeepLast,
                                                    "), got ", checkpoint.keep_last()));
  }
  if (checkpoint.keep_every() < 0) {
    errors.Add("checkpoint.keep_every",
               absl::StrCat("must be >= 0 (0 keeps none), got ", checkpoint.keep_every()));
  }
  if (checkpoint.resume_from_step() < 0) {
    errors.Add("checkpoint.resume_from_step",
               absl::StrCat("must be >= 0 (0: the newest), got ", checkpoint.resume_from_step()));
  }
  if (checkpoint.resume_from_step() > 0 && checkpoint.resume_from_job().empty()) {
    errors.Add("checkpoint.resume_from_step", "is set but checkpoint.resume_from_job is empty");
  }
  if (!checkpoint.init_from().empty()) {
    if (!IsPathText(checkpoint.init_from())) {
      errors.Add("checkpoint.init_from",
                 absl::StrCat(Quoted(checkpoint.init_from()), " must be a path of at most ",
                              kMaxPatternLength, " bytes without control characters"));
    }
    if (!checkpoint.resume_from_job().empty()) {
      errors.Add("checkpoint.init_from",
                 "is set with checkpoint.resume_from_job: start from one or the other");
    }
  }
  const std::string& from = checkpoint.resume_from_job();
  if (!from.empty() && (from.size() > 80 || !std::all_of(from.begin(), from.end(), [](char c) {
                          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                        }))) {
    errors.Add("checkpoint.resume_from_job",
               absl::StrCat(Quoted(from), " is not a job id (at most 80 lower-case letters, "
                                          "digits, '-')"));
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> NormalizeJobSpec(const v1::JobSpec& input) {
  v1::JobSpec spec = input;
  // Fields this coordinator does not know would be stored, persisted and
  // returned with every Get, List and Watch event: an unbounded side
  // channel. They are dropped (a newer client's options have no effect here).
  spec.DiscardUnknownFields();
  Errors errors;
  CheckName(spec.name(), errors);

  if (spec.device_kind() == v1::DEVICE_KIND_UNSPECIFIED) {
    spec.set_device_kind(v1::DEVICE_KIND_CPU);
  } else if (!v1::DeviceKind_IsValid(spec.device_kind())) {
    errors.Add("device_kind", absl::StrCat("unknown value ", static_cast<int>(spec.device_kind()),
                                           "; use CPU or GPU"));
  }

  bool heads_ok = false, vocab_ok = false, layers_ok = false;
  CheckModel(spec.model(), errors, heads_ok, vocab_ok, layers_ok);
  CheckPrecision(spec.device_kind(), *spec.mutable_model(), errors);
  const bool parallel_ok = CheckParallelism(*spec.mutable_parallelism(), spec.model(), heads_ok,
                                            vocab_ok, layers_ok, errors);
  const int64_t micro_batches = CheckBatch(spec.batch(), errors);
  if (spec.steps() <= 0) {
    errors.Add("steps", absl::StrCat("must be > 0, got ", spec.steps()));
  }
  CheckOptimizer(*spec.mutable_optimizer(), spec.steps(), errors);
  CheckData(*spec.mutable_data(), spec.model(), vocab_ok, errors);
  const int64_t replica =
      parallel_ok ? int64_t{spec.parallelism().tensor()} * spec.parallelism().pipeline() : 0;
  CheckElastic(*spec.mutable_elastic(), replica, micro_batches,
               spec.parallelism().reduction() == v1::ParallelismConfig::REDUCTION_TRANSPORT,
               errors);
  CheckCheckpoint(*spec.mutable_checkpoint(), errors);

  if (!errors.empty()) return absl::InvalidArgumentError(errors.Joined());
  return spec;
}

void ApplyCheckpointDefaults(v1::CheckpointPolicy& policy) {
  if (policy.keep_last() == 0) policy.set_keep_last(kDefaultKeepLast);
}

int MicroBatchesPerStep(const v1::JobSpec& spec) {
  if (spec.batch().micro_batch_size() <= 0) return 0;
  return spec.batch().global_batch_size() / spec.batch().micro_batch_size();
}

}  // namespace cohort
