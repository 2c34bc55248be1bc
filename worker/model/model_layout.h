#pragma once
// ModelLayout: which part of the GPT one rank holds under tensor parallelism
// (degree tp, this rank's coordinate tp_rank) and pipeline parallelism (pp
// stages, this rank's stage). The default is the whole model.
//
// Stages. The L layers are cut into pp consecutive runs as evenly as
// possible, earlier stages taking the remainder (the last stage also runs
// the final LayerNorm, the LM head and the loss). Stage 0 holds the token and
// position embeddings; the last stage holds the LM head, which is tied to the
// token embedding, so with pp > 1 both ends hold a copy of wte.
//
// Tensor parallelism (Megatron): every per-layer matrix is split tp ways by
// heads or features and the token embedding by vocabulary rows, so tp must
// divide the heads, 4C and the padded vocabulary.
//
// Thread-safety: plain data.

#include "absl/status/status.h"
#include "common/layout/mesh_layout.h"
#include "worker/model/gpt_config.h"

namespace cohort::model {

struct ModelLayout {
  int tp = 1;
  int tp_rank = 0;
  int pp = 1;
  int stage = 0;

  friend bool operator==(const ModelLayout&, const ModelLayout&) = default;

  // The model shard of the rank at `coords` in `shape` (its tensor and
  // pipeline coordinates; the data axis does not shard the model).
  static ModelLayout Of(const layout::MeshShape& shape, const layout::MeshCoords& coords) {
    return {shape.tensor, coords.tensor, shape.pipeline, coords.pipeline};
  }

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pp - 1; }
  // Whether this rank holds the token and position embeddings.
  bool has_embedding() const { return first_stage(); }
  // Whether this rank runs the final LayerNorm, the LM head and the loss.
  bool has_head() const { return last_stage(); }
  bool whole_model() const { return tp == 1 && pp == 1; }

  // OK, or InvalidArgument naming the field: tp, pp >= 1; tp_rank and stage
  // in range; tp dividing config.heads and config.PaddedVocab(); pp <=
  // config.layers. `config` must be valid.
  absl::Status Validate(const GptConfig& config) const;

  // First layer of `stage` (stage == pp gives config.layers).
  int FirstLayer(const GptConfig& config, int of_stage) const;
  // This stage's layers: [first_layer(), first_layer() + num_layers()).
  int first_layer(const GptConfig& config) const { return FirstLayer(config, stage); }
  int num_layers(const GptConfig& config) const {
    return FirstLayer(config, stage + 1) - FirstLayer(config, stage);
  }
  // Vocabulary rows of wte this rank holds: [vocab_start, vocab_start + vocab_rows).
  int vocab_rows(const GptConfig& config) const { return config.PaddedVocab() / tp; }
  int vocab_start(const GptConfig& config) const { return tp_rank * vocab_rows(config); }
};

}  // namespace cohort::model
