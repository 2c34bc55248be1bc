#include "worker/model/model_layout.h"

#include "absl/strings/str_cat.h"
#include "common/job_spec/sharding.h"

namespace cohort::model {

absl::Status ModelLayout::Validate(const GptConfig& config) const {
  if (tp < 1 || pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelLayout: tp (", tp, ") and pp (", pp, ") must be >= 1"));
  }
  if (tp_rank < 0 || tp_rank >= tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelLayout.tp_rank ", tp_rank, " outside [0, tp=", tp, ")"));
  }
  if (stage < 0 || stage >= pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelLayout.stage ", stage, " outside [0, pp=", pp, ")"));
  }
  const ShardingCheck sharding =
      CheckSharding(config.heads, config.PaddedVocab(), config.layers, tp, pp);
  if (!sharding.tensor_divides_heads) {
    return absl::InvalidArgumentError(absl::StrCat("ModelLayout.tp ", tp, " does not divide ",
                                                   config.heads, " attention heads"));
  }
  if (!sharding.tensor_divides_vocabulary) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelLayout.tp ", tp, " does not divide the padded vocabulary ", config.PaddedVocab()));
  }
  if (!sharding.pipeline_fits_layers) {
    return absl::InvalidArgumentError(absl::StrCat("ModelLayout.pp ", pp, " exceeds ",
                                                   config.layers,
                                                   " layers: every stage needs at least one"));
  }
  return absl::OkStatus();
}

int ModelLayout::FirstLayer(const GptConfig& config, int of_stage) const {
  const int base = config.layers / pp;
  const int extra = config.layers % pp;
  return of_stage * base + (of_stage < extra ? of_stage : extra);
}

}  // namespace cohort::model
