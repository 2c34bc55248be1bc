#pragma once
// ParameterTable: the GPT parameters as an ordered list of tensors laid out
// back to back in one flat fp32 arena, in llm.c's order:
//
//   wte (Vp,C)  wpe (maxT,C)  ln1w (L,C)  ln1b (L,C)  qkvw (L,3C,C)  qkvb (L,3C)
//   attprojw (L,C,C)  attprojb (L,C)  ln2w (L,C)  ln2b (L,C)  fcw (L,4C,C)
//   fcb (L,4C)  fcprojw (L,C,4C)  fcprojb (L,C)  lnfw (C)  lnfb (C)
//
// Parameters, gradients, and AdamW's m and v all use this same layout, so a
// flat offset names the same scalar in each (ZeRO-1 slices the flat range).
// Each entry also records how tensor parallelism shards it and whether AdamW
// decays it.
//
// Under a ModelLayout other than the whole model the table describes one
// rank's shard: the same tensors in the same order, each holding only this
// rank's part (its stage's layers, its tensor-parallel slice), and tensors
// the stage does not hold are empty (numel 0). Every entry names its part of
// the unsharded tensor as a box (start and extent per dimension) of a
// logical global shape; the shard's elements are the box's in row-major
// order. qkvw and qkvb have logical shapes (L, 3, C, C) and (L, 3, C) so that
// splitting the heads of q, k and v is one box on the third dimension.
//
// Thread-safety: immutable after construction; safe to share.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/model/gpt_config.h"
#include "worker/model/model_layout.h"

namespace cohort::model {

// Index of each tensor in the table (the llm.c order above).
enum ParamId : int {
  kWte = 0,
  kWpe,
  kLn1w,
  kLn1b,
  kQkvw,
  kQkvb,
  kAttprojw,
  kAttprojb,
  kLn2w,
  kLn2b,
  kFcw,
  kFcb,
  kFcprojw,
  kFcprojb,
  kLnfw,
  kLnfb,
  kNumParamTensors,
};

// How tensor parallelism (TP degree t) splits a tensor. Weights are stored
// (OC, C), so "rows" are output features and "columns" input features. For
// per-layer tensors the split applies to each layer's slice.
enum class ShardKind {
  kReplicated,    // every TP rank holds all of it (LayerNorms, row-parallel biases, wpe)
  kSplitRows,     // output features split: Megatron ColumnParallelLinear (fcw, fcb)
  kSplitColumns,  // input features split: Megatron RowParallelLinear (attprojw, fcprojw)
  kSplitVocab,    // vocab rows split: VocabParallelEmbedding and the tied LM head (wte)
  kSplitHeads,    // QKV: each of the q, k, v row blocks split by heads (qkvw, qkvb)
};

const char* ShardKindName(ShardKind kind);

struct ParameterInfo {
  ParamId id;
  std::string name;            // "wte", "qkvw", ...
  std::vector<int64_t> shape;  // this rank's, (layers of the stage, ...) for per-layer tensors
  size_t offset = 0;           // first element in the flat arena
  size_t numel = 0;
  ShardKind shard = ShardKind::kReplicated;
  // Whether AdamW applies weight decay: the matrices and embeddings (rank >= 2
  // per layer), never biases or LayerNorm parameters (GPT-2 / nanoGPT).
  bool weight_decay = false;
  bool per_layer = false;  // shape[0] == the stage's layer count
  // The unsharded tensor's logical shape, and this rank's box in it (all
  // zero extents when the rank does not hold the tensor).
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_start;
  std::vector<int64_t> box_extent;

  size_t end() const { return offset + numel; }
  bool present() const { return numel > 0; }
  // Elements of one layer's slice (numel / L for per-layer tensors).
  size_t LayerNumel() const;
};

class ParameterTable {
 public:
  // The table of the shard `layout` selects (the whole model by default).
  // `config` and `layout` must be valid (GptConfig::Validate,
  // ModelLayout::Validate).
  explicit ParameterTable(const GptConfig& config, const ModelLayout& layout = {});

  const ModelLayout& layout() const { return layout_; }

  const std::vector<ParameterInfo>& tensors() const { return tensors_; }
  const ParameterInfo& operator[](ParamId id) const { return tensors_[id]; }
  // Total elements of the flat arena.
  size_t num_params() const { return num_params_; }
  // The tensor with this name, or nullptr.
  const ParameterInfo* Find(std::string_view name) const;
  // The tensor containing flat element `offset` (< num_params()).
  const ParameterInfo& TensorAt(size_t offset) const;

 private:
  ModelLayout layout_;
  std::vector<ParameterInfo> tensors_;
  size_t num_params_ = 0;
};

// Copies `info`'s box out of the unsharded tensor `global` (global_shape,
// row-major) into `shard` (info.numel elements), or back.
void ExtractShard(const ParameterInfo& info, const float* global, float* shard);
void InsertShard(const ParameterInfo& info, const float* shard, float* global);

}  // namespace cohort::model
