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

namespace {

// How one tensor is laid out, before the layout cuts it.
struct Spec {
  ParamId id;
  const char* name;
  std::vector<int64_t> global_shape;  // logical (qkv: (L, 3, C, C))
  ShardKind shard;
  bool weight_decay;
  bool per_layer;
  enum Holder { kEveryStage, kFirstStage, kLastStage, kEmbeddingStages } holder;
};

// Dimension of global_shape that tensor parallelism splits; -1: none.
int SplitDim(const Spec& spec) {
  switch (spec.shard) {
    case ShardKind::kReplicated:
      return -1;
    case ShardKind::kSplitVocab:
      return 0;
    case ShardKind::kSplitRows:
      return 1;  // (L, OC, C) or (L, OC)
    case ShardKind::kSplitColumns:
      return 2;  // (L, OC, C)
    case ShardKind::kSplitHeads:
      return 2;  // (L, 3, C, C) or (L, 3, C)
  }
  return -1;
}

bool Holds(const Spec& spec, const ModelLayout& layout) {
  switch (spec.holder) {
    case Spec::kEveryStage:
      return true;
    case Spec::kFirstStage:
      return layout.first_stage();
    case Spec::kLastStage:
      return layout.last_stage();
    case Spec::kEmbeddingStages:
      return layout.first_stage() || layout.last_stage();
  }
  return false;
}

// Calls fn(global_offset, shard_offset, run) for every contiguous run of the
// box, in row-major order.
template <typename Fn>
void ForEachBoxRun(const ParameterInfo& info, Fn fn) {
  if (info.numel == 0) return;
  const size_t dims = info.global_shape.size();
  // Strides of the global tensor; runs are along the last dimension.
  std::vector<size_t> stride(dims, 1);
  for (size_t d = dims - 1; d > 0; --d) {
    stride[d - 1] = stride[d] * static_cast<size_t>(info.global_shape[d]);
  }
  const size_t run = static_cast<size_t>(info.box_extent[dims - 1]);
  std::vector<int64_t> index(dims, 0);  // within the box, last dimension always 0
  size_t shard_offset = 0;
  while (true) {
    size_t global_offset = 0;
    for (size_t d = 0; d < dims; ++d) {
      global_offset += static_cast<size_t>(info.box_start[d] + index[d]) * stride[d];
    }
    fn(global_offset, shard_offset, run);
    shard_offset += run;
    // Next index over the leading dimensions, last of them fastest.
    size_t d = dims - 1;
    while (d > 0) {
      --d;
      if (++index[d] < info.box_extent[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (dims == 1) return;
  }
}

}  // namespace

ParameterTable::ParameterTable(const GptConfig& config, const ModelLayout& layout)
    : layout_(layout) {
  CHECK(config.Validate().ok()) << config.Validate();
  CHECK(layout.Validate(config).ok()) << layout.Validate(config);
  const int64_t L = config.layers;
  const int64_t C = config.width;
  const int64_t Vp = config.PaddedVocab();
  const int64_t maxT = config.context_length;
  const int64_t tp = layout.tp;
  const int64_t first_layer = layout.first_layer(config);
  const int64_t stage_layers = layout.num_layers(config);
  using S = ShardKind;
  const Spec specs[] = {
      {kWte, "wte", {Vp, C}, S::kSplitVocab, true, false, Spec::kEmbeddingStages},
      {kWpe, "wpe", {maxT, C}, S::kReplicated, true, false, Spec::kFirstStage},
      {kLn1w, "ln1w", {L, C}, S::kReplicated, false, true, Spec::kEveryStage},
      {kLn1b, "ln1b", {L, C}, S::kReplicated, false, true, Spec::kEveryStage},
      {kQkvw, "qkvw", {L, 3, C, C}, S::kSplitHeads, true, true, Spec::kEveryStage},
      {kQkvb, "qkvb", {L, 3, C}, S::kSplitHeads, false, true, Spec::kEveryStage},
      {kAttprojw, "attprojw", {L, C, C}, S::kSplitColumns, true, true, Spec::kEveryStage},
      {kAttprojb, "attprojb", {L, C}, S::kReplicated, false, true, Spec::kEveryStage},
      {kLn2w, "ln2w", {L, C}, S::kReplicated, false, true, Spec::kEveryStage},
      {kLn2b, "ln2b", {L, C}, S::kReplicated, false, true, Spec::kEveryStage},
      {kFcw, "fcw", {L, 4 * C, C}, S::kSplitRows, true, true, Spec::kEveryStage},
      {kFcb, "fcb", {L, 4 * C}, S::kSplitRows, false, true, Spec::kEveryStage},
      {kFcprojw, "fcprojw", {L, C, 4 * C}, S::kSplitColumns, true, true, Spec::kEveryStage},
      {kFcprojb, "fcprojb", {L, C}, S::kReplicated, false, true, Spec::kEveryStage},
      {kLnfw, "lnfw", {C}, S::kReplicated, false, false, Spec::kLastStage},
      {kLnfb, "lnfb", {C}, S::kReplicated, false, false, Spec::kLastStage},
  };
  tensors_.reserve(kNumParamTensors);
  size_t offset = 0;
  for (const Spec& spec : specs) {
    CHECK(spec.id == static_cast<ParamId>(tensors_.size()));
    ParameterInfo info;
    info.id = spec.id;
    info.name = spec.name;
    info.shard = spec.shard;
    info.weight_decay = spec.weight_decay;
    info.per_layer = spec.per_layer;
    info.global_shape = spec.global_shape;
    info.box_start.assign(spec.global_shape.size(), 0);
    info.box_extent = spec.global_shape;
    if (spec.per_layer) {
      info.box_start[0] = first_layer;
      info.box_extent[0] = stage_layers;
    }
    if (const int d = SplitDim(spec); d >= 0) {
      info.box_extent[d] = spec.global_shape[d] / tp;
      info.box_start[d] = info.box_extent[d] * layout.tp_rank;
    }
    if (!Holds(spec, layout)) {
      std::fill(info.box_start.begin(), info.box_start.end(), 0);
      std::fill(info.box_extent.begin(), info.box_extent.end(), 0);
    }
    // The engine's shape: the box with qkv's (3, C/tp) merged into 3C/tp rows.
    info.shape = info.box_extent;
    if (spec.shard == S::kSplitHeads) {
      info.shape[1] *= info.shape[2];
      info.shape.erase(info.shape.begin() + 2);
    }
    size_t numel = 1;
    for (int64_t d : info.box_extent) numel *= static_cast<size_t>(d);
    info.offset = offset;
    info.numel = numel;
    tensors_.push_back(std::move(info));
    offset += numel;
  }
  num_params_ = offset;
}

void ExtractShard(const ParameterInfo& info, const float* global, float* shard) {
  ForEachBoxRun(info, [&](size_t global_offset, size_t shard_offset, size_t run) {
    std::copy_n(global + global_offset, run, shard + shard_offset);
  });
}

void InsertShard(const ParameterInfo& info, const float* shard, float* global) {
  ForEachBoxRun(info, [&](size_t global_offset, size_t shard_offset, size_t run) {
    std::copy_n(shard + shard_offset, run, global + global_offset);
  });
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
