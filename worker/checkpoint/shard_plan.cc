#include "worker/checkpoint/shard_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/gpt2_hf_layout.h"
#include "common/layout/mesh_layout.h"
#include "worker/model/initial_weights.h"

namespace cohort::checkpoint {
namespace {

// Whether this rank writes `info` (it holds it and is its one owner).
bool Owns(const model::ParameterInfo& info, const model::ModelLayout& layout) {
  if (!info.present()) return false;
  if (info.shard == model::ShardKind::kReplicated && layout.tp_rank != 0) return false;
  if (info.id == model::kWte && !layout.first_stage()) return false;
  return true;
}

Box LocalBox(const model::ParameterInfo& info) { return Box{info.box_start, info.box_extent}; }

}  // namespace

const char* StateKindPrefix(StateKind kind) {
  switch (kind) {
    case StateKind::kParam:
      return "param";
    case StateKind::kAdamM:
      return "adam_m";
    case StateKind::kAdamV:
      return "adam_v";
  }
  return "unknown";
}

std::string TensorName(StateKind kind, const std::string& parameter) {
  return absl::StrCat(StateKindPrefix(kind), "/", parameter);
}

std::vector<v1::TensorInfo> Catalog(const model::GptConfig& config) {
  const model::ParameterTable whole(config);
  std::vector<v1::TensorInfo> out;
  for (StateKind kind : kStateKinds) {
    for (const model::ParameterInfo& info : whole.tensors()) {
      v1::TensorInfo tensor;
      tensor.set_name(TensorName(kind, info.name));
      tensor.set_dtype(v1::TENSOR_DTYPE_FLOAT32);
      for (int64_t d : info.global_shape) tensor.add_global_shape(d);
      out.push_back(std::move(tensor));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const v1::TensorInfo& a, const v1::TensorInfo& b) { return a.name() < b.name(); });
  return out;
}

ArenaRange WriteRange(const model::ParameterTable& table, const RankPosition& position) {
  const layout::ShardRange range =
      layout::DataShardRange(table.num_params(), position.shape.data, position.coords.data);
  return {range.begin, range.end};
}

std::vector<SavePiece> PlanSave(const model::ParameterTable& table, const RankPosition& position,
                                int64_t max_chunk_elements) {
  const ArenaRange range = WriteRange(table, position);
  std::vector<SavePiece> pieces;
  for (StateKind kind : kStateKinds) {
    for (const model::ParameterInfo& info : table.tensors()) {
      if (!Owns(info, position.model())) continue;
      const size_t begin = std::max(range.begin, info.offset);
      const size_t end = std::min(range.end, info.end());
      if (begin >= end) continue;
      const Box local = LocalBox(info);
      const std::vector<Box> boxes =
          FlatRangeToBoxes(info.box_extent, static_cast<int64_t>(begin - info.offset),
                           static_cast<int64_t>(end - info.offset), max_chunk_elements);
      size_t offset = begin;
      for (const Box& box : boxes) {
        SavePiece piece;
        piece.kind = kind;
        piece.tensor = TensorName(kind, info.name);
        piece.box = Translate(box, local.start);
        piece.arena_offset = offset;
        piece.count = static_cast<size_t>(box.NumElements());
        offset += piece.count;
        pieces.push_back(std::move(piece));
      }
    }
  }
  return pieces;
}

std::vector<LoadPiece> PlanLoad(const model::ParameterTable& table, ArenaRange optimizer,
                                ArenaRange weights) {
  std::vector<LoadPiece> pieces;
  for (StateKind kind : kStateKinds) {
    const ArenaRange range =
        kind == StateKind::kParam
            ? ArenaRange{weights.begin, std::min(weights.end, table.num_params())}
            : optimizer;
    for (const model::ParameterInfo& info : table.tensors()) {
      if (!info.present()) continue;
      const size_t begin = std::max(range.begin, info.offset);
      const size_t end = std::min(range.end, info.end());
      if (begin >= end) continue;
      LoadPiece piece;
      piece.kind = kind;
      piece.tensor = TensorName(kind, info.name);
      piece.local_box = LocalBox(info);
      piece.first = static_cast<int64_t>(begin - info.offset);
      piece.count = static_cast<int64_t>(end - begin);
      piece.arena_offset = begin;
      pieces.push_back(std::move(piece));
    }
  }
  return pieces;
}

std::string ModelFingerprint(const model::GptConfig& config) {
  // One spelling of the fingerprint, shared with cohortctl and the
  // safetensors import (common/gpt2_hf_layout.h).
  return FormatModelFingerprint(model::GptShapeOf(config));
}

}  // namespace cohort::checkpoint
