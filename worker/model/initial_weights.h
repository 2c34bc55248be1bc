#pragma once
// Initial weights from a safetensors file (the job spec's
// checkpoint.init_from), in either layout docs/checkpoint-format.md
// describes:
//
//   Cohort's: ParameterTable names ("wte", "qkvw", ...) in their logical
//     global shapes, as `cohortctl checkpoints export` writes; recognised by
//     the metadata "format": "cohort-gpt" or a tensor named "wte".
//   Hugging Face's GPT-2 (GPT2LMHeadModel's state dict, with or without the
//     "transformer." prefix): recognised by transformer.wte.weight or
//     wte.weight; mapped by common/gpt2_hf_layout.h.
//
// The file holds the unsharded model; a rank takes its shard of each tensor
// (ExtractShard), one tensor at a time, so memory beyond the parameters is
// the largest unsharded tensor (plus one layer's slice for HF's transposed
// weights). The vocabulary padding rows of wte (V..Vp-1) are always zero.
//
// Thread-compatible: pure apart from reading the file.

#include <string>

#include "absl/status/status.h"
#include "common/gpt2_hf_layout.h"
#include "worker/model/gpt_config.h"
#include "worker/model/parameter_table.h"

namespace cohort::model {

// `config`'s shape as common/ code describes it (the padded vocab resolved).
GptShape GptShapeOf(const GptConfig& config);
// And back (padded_vocab explicit).
GptConfig GptConfigOf(const GptShape& shape);

// Fills params[0 .. table.num_params()) (host memory) with this rank's shard
// of the weights in `path`. `table` must be a ParameterTable of `config`.
// Errors, each naming the file: the reader's (NotFound, DataLoss for a
// malformed file, ...); InvalidArgument for a file in neither layout, a
// missing or unexpected tensor, a shape that disagrees with `config` (naming
// the field), a Cohort file exported from another model (its "model"
// metadata), or an untied HF lm_head.weight. On error `params` may be partly
// written.
absl::Status LoadInitialWeights(const std::string& path, const GptConfig& config,
                                const ParameterTable& table, float* params);

}  // namespace cohort::model
