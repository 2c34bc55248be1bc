#pragma once
// Which parts of a checkpoint one rank writes and reads, for any (dp, tp,
// pp) layout. Pure arithmetic over the ParameterTable (docs/checkpoint-format.md).
//
// Tensors. A checkpoint of a GPT holds, for each of the 16 parameter tensors
// of the ParameterTable, three tensors in the unsharded logical shape:
// "param/<name>" (the weights), "adam_m/<name>" and "adam_v/<name>" (AdamW's
// moments), all fp32.
//
// Writing. Every rank of the (tensor rank, stage) shard holds the same
// weights and, without ZeRO-1, the same moments; with ZeRO-1 data rank r
// holds the moments of its shard range only. So the writing rule is the
// same for all three: data rank r writes the elements of DataShardRange(n,
// dp, r) of its arena (the ZeRO-1 shard, whether or not ZeRO-1 is on), of
// the tensors it owns: a tensor replicated across the tensor group only on
// tensor rank 0, and the tied token embedding (held by both end stages of a
// pipeline) only on stage 0. All ranks together write every element of
// every tensor exactly once. A contiguous run of the arena is one box (or a
// few) of the tensor's global shape, so a chunk's bytes are a slice of the
// rank's buffer.
//
// Reading. A rank needs every weight of its shard and the moments of its
// optimizer range (its ZeRO-1 shard, or everything), as boxes of the global
// tensors; the chunks that overlap them are read whatever layout wrote them.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/v1/checkpoints.pb.h"
#include "common/box.h"
#include "worker/model/gpt_config.h"
#include "worker/model/parameter_table.h"

namespace cohort::checkpoint {

enum class StateKind { kParam = 0, kAdamM = 1, kAdamV = 2 };
inline constexpr StateKind kStateKinds[] = {StateKind::kParam, StateKind::kAdamM,
                                            StateKind::kAdamV};

// "param", "adam_m", "adam_v".
const char* StateKindPrefix(StateKind kind);
// "param/wte", ...
std::string TensorName(StateKind kind, const std::string& parameter);

// Where a rank sits in its generation's mesh.
struct RankPosition {
  layout::MeshShape shape;
  layout::MeshCoords coords;
  // Its model shard.
  model::ModelLayout model() const { return model::ModelLayout::Of(shape, coords); }
};

// The checkpoint's tensors for `config` (name, fp32, global shape; no
// chunks), sorted by name: what every writer declares.
std::vector<v1::TensorInfo> Catalog(const model::GptConfig& config);

// A contiguous run of the rank's arena that is one chunk.
struct SavePiece {
  StateKind kind = StateKind::kParam;
  std::string tensor;
  Box box;                  // in the tensor's global coordinates
  size_t arena_offset = 0;  // first flat element in the rank's arena
  size_t count = 0;         // == box.NumElements()
};

// The arena range [begin, end) whose state `position` writes.
struct ArenaRange {
  size_t begin = 0;
  size_t end = 0;
};
ArenaRange WriteRange(const model::ParameterTable& table, const RankPosition& position);

// What `position` writes (see above), every piece at most
// `max_chunk_elements` elements (0: no limit), in arena order per kind.
std::vector<SavePiece> PlanSave(const model::ParameterTable& table, const RankPosition& position,
                                int64_t max_chunk_elements);

// A part this rank reads: flat elements [first, first + count) of its box of
// `tensor` (row-major over local_box), which go to arena elements
// [arena_offset, arena_offset + count).
struct LoadPiece {
  StateKind kind = StateKind::kParam;
  std::string tensor;
  Box local_box;  // the rank's box of the tensor, global coordinates
  int64_t first = 0;
  int64_t count = 0;
  size_t arena_offset = 0;
};

// Weights: the `weights` range of the rank's shard's arena (all of it by
// default). Moments: the optimizer range [optimizer.begin, optimizer.end).
std::vector<LoadPiece> PlanLoad(const model::ParameterTable& table, ArenaRange optimizer,
                                ArenaRange weights = {0, SIZE_MAX});

// "layers=4 heads=4 width=128 vocab=512 padded_vocab=512 context=64": the model a
// checkpoint was written for, stored beside it and compared at load.
std::string ModelFingerprint(const model::GptConfig& config);

}  // namespace cohort::checkpoint
