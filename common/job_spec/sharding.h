#pragma once
// How a GPT model may be cut: the one statement of the rule that the job
// spec validator checks at submit and ModelLayout::Validate checks as an
// invariant where a model is built. Each caller words the failure for its
// own reader (a spec field, a layout).

#include <cstdint>

#include "common/job_spec/defaults.h"

namespace cohort {

// The vocabulary rounded up to a multiple of kVocabPadMultiple (GPT-2:
// 50257 -> 50304): the token embedding's rows, which tensor parallelism
// splits.
inline int64_t PaddedVocabulary(int64_t vocab_size) {
  return (vocab_size + kVocabPadMultiple - 1) / kVocabPadMultiple * kVocabPadMultiple;
}

// Tensor parallelism splits the attention heads and the padded vocabulary
// evenly; pipeline parallelism gives every stage at least one layer. All
// arguments >= 1.
struct ShardingCheck {
  bool tensor_divides_heads = true;
  bool tensor_divides_vocabulary = true;
  bool pipeline_fits_layers = true;
  bool ok() const {
    return tensor_divides_heads && tensor_divides_vocabulary && pipeline_fits_layers;
  }
};
inline ShardingCheck CheckSharding(int64_t heads, int64_t padded_vocabulary, int64_t layers,
                                   int64_t tensor, int64_t pipeline) {
  return {heads % tensor == 0, padded_vocabulary % tensor == 0, pipeline <= layers};
}

}  // namespace cohort
