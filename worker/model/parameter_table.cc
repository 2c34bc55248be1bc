#include "worker/model/parameter_table.h"

#include <algorithm>
#include <utility>

#include "common/log.h"

namespace cohort::model {

const char* ShardKindName(ShardKind kind) {
  switch (kind) {
    case ShardKind::kReplicated:
      return "replicated";
    case ShardKind::kSplitRows:
      return "split_rows";
    case ShardKind::kSplitColumns:
      return "split_columns";
    case ShardKind::kSplitVocab:
      return "split_vocab";
    case ShardKind::kSplitHeads:
      return "split_heads";
  }
  return "unknown";
}

size_t ParameterInfo::LayerNumel() const {
  return per_layer ? numel / static_cast<size_t>(shape[0]) : numel;
}

ParameterTable::ParameterTable(const GptConfig& config) {
  CHECK(config.Validate().ok()) << config.Validate();
  const int64_t L = config.layers;
  const int64_t C = config.width;
  const int64_t Vp = config.PaddedVocab();
  const int64_t maxT = config.context_length;
  using S = ShardKind;
  struct Spec {
    ParamId id;
    const char* name;
    std::vector<int64_t> shape;
    ShardKind shard;
    bool weight_decay;
    bool per_layer;
  };
  const Spec specs[] = {
      {kWte, "wte", {Vp, C}, S::kSplitVocab, true, false},
      {kWpe, "wpe", {maxT, C}, S::kReplicated, true, false},
      {kLn1w, "ln1w", {L, C}, S::kReplicated, false, true},
      {kLn1b, "ln1b", {L, C}, S::kReplicated, false, true},
      {kQkvw, "qkvw", {L, 3 * C, C}, S::kSplitHeads, true, true},
      {kQkvb, "qkvb", {L, 3 * C}, S::kSplitHeads, false, true},
      {kAttprojw, "attprojw", {L, C, C}, S::kSplitColumns, true, true},
      {kAttprojb, "attprojb", {L, C}, S::kReplicated, false, true},
      {kLn2w, "ln2w", {L, C}, S::kReplicated, false, true},
      {kLn2b, "ln2b", {L, C}, S::kReplicated, false, true},
      {kFcw, "fcw", {L, 4 * C, C}, S::kSplitRows, true, true},
      {kFcb, "fcb", {L, 4 * C}, S::kSplitRows, false, true},
      {kFcprojw, "fcprojw", {L, C, 4 * C}, S::kSplitColumns, true, true},
      {kFcprojb, "fcprojb", {L, C}, S::kReplicated, false, true},
      {kLnfw, "lnfw", {C}, S::kReplicated, false, false},
      {kLnfb, "lnfb", {C}, S::kReplicated, false, false},
  };
  tensors_.reserve(kNumParamTensors);
  size_t offset = 0;
  for (const Spec& spec : specs) {
    CHECK(spec.id == static_cast<ParamId>(tensors_.size()));
    size_t numel = 1;
    for (int64_t d : spec.shape) numel *= static_cast<size_t>(d);
    ParameterInfo info;
    info.id = spec.id;
    info.name = spec.name;
    info.shape = spec.shape;
    info.offset = offset;
    info.numel = numel;
    info.shard = spec.shard;
    info.weight_decay = spec.weight_decay;
    info.per_layer = spec.per_layer;
    tensors_.push_back(std::move(info));
    offset += numel;
  }
  num_params_ = offset;
}

const ParameterInfo* ParameterTable::Find(std::string_view name) const {
  for (const ParameterInfo& info : tensors_) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

const ParameterInfo& ParameterTable::TensorAt(size_t offset) const {
  CHECK(offset < num_params_) << "offset " << offset << " >= " << num_params_;
  // The first tensor whose end lies beyond `offset`.
  auto it =
      std::upper_bound(tensors_.begin(), tensors_.end(), offset,
                       [](size_t value, const ParameterInfo& info) { return value < info.end(); });
  return *it;
}

}  // namespace cohort::model
