#pragma once
// The activation and activation-gradient tensors of one GPT micro-batch,
// carved from two backend arenas (llm.c's ActivationTensors, minus the
// per-layer gradient copies: the backward pass reuses one set of gradient
// buffers for every layer). Internal to GptModel.
//
// Dtypes (backend.h, "Activation storage"): the activations and their
// gradients are of the backend's activation_dtype() (bf16 on a GPU that
// computes in bf16, which halves their memory); the statistics (LayerNorm
// means and rstds, losses, lse, the vocab-parallel cross-entropy's row
// maxima and sums) and attention's state are fp32 in any case, as the ops
// take them. The arenas are raw memory counted in bytes, whatever the
// dtype of their Buffer: each view takes its own dtype, so fp32 and bf16
// views interleave in one arena in the order below.
//
// Sizes follow the rank's ModelLayout: only its stage's layers, tensor-
// parallel widths (qkv 3C/tp, atty C/tp, fch 4C/tp, logits Vp/tp), the head
// tensors only on the last stage. `encoded` is the stage's input: the
// embedding output on the first stage, the previous stage's activations on
// the others.
//
// Thread-safety: plain data.

#include <cstddef>
#include <vector>

#include "worker/compute/backend.h"
#include "worker/model/gpt_config.h"
#include "worker/model/model_layout.h"

namespace cohort::model {

struct GptLayerActivations {
  compute::TensorSpan ln1;        // (B,T,C)
  compute::TensorSpan ln1_mean;   // (B,T)
  compute::TensorSpan ln1_rstd;   // (B,T)
  compute::TensorSpan qkv;        // (B,T,3C)
  compute::TensorSpan atty;       // (B,T,C)
  compute::TensorSpan att;        // Backend::AttentionStateNumel(B,T,C/tp,NH/tp), fp32
  compute::TensorSpan attproj;    // (B,T,C)
  compute::TensorSpan residual2;  // (B,T,C)
  compute::TensorSpan ln2;        // (B,T,C)
  compute::TensorSpan ln2_mean;   // (B,T)
  compute::TensorSpan ln2_rstd;   // (B,T)
  compute::TensorSpan fch;        // (B,T,4C)
  compute::TensorSpan fch_gelu;   // (B,T,4C)
  compute::TensorSpan fcproj;     // (B,T,C)
  compute::TensorSpan residual3;  // (B,T,C)
};

struct GptActivations {
  compute::TensorSpan encoded;  // (B,T,C)
  std::vector<GptLayerActivations> layers;
  // Last stage only (empty elsewhere):
  compute::TensorSpan lnf;       // (B,T,C)
  compute::TensorSpan lnf_mean;  // (B,T)
  compute::TensorSpan lnf_rstd;  // (B,T)
  compute::TensorSpan logits;    // (B,T,Vp/tp)
  compute::TensorSpan losses;    // (B,T)
  compute::TensorSpan lse;       // (B,T)
  // Vocab-parallel cross-entropy (tp > 1): row maxima, then the sums of
  // exponentials and the target logits.
  compute::TensorSpan row_max;  // (B,T)
  compute::TensorSpan ce_sums;  // (2,B,T)
};

// Gradient buffers, shared by all layers during the backward pass.
struct GptActivationGrads {
  compute::TensorSpan dresidual;  // (B,T,C) gradient of the residual stream
  compute::TensorSpan dln;        // (B,T,C) gradient of a LayerNorm output
  compute::TensorSpan datty;      // (B,T,C)
  compute::TensorSpan dqkv;       // (B,T,3C)
  compute::TensorSpan dfch;       // (B,T,4C)
  // No gradient of the GELU's output (Backend::MatmulGeluBackward goes from
  // dresidual to dfch in one op) and none of the logits: the backward
  // writes it over the logits (GptActivations::logits).
};

// Bytes the layouts below need for a (B,T) micro-batch on `backend` (its
// activation dtype and attention state); largest at the largest B and T.
// Multiples of 256 bytes, like every view's offset.
size_t ActivationsBytes(const GptConfig& config, const ModelLayout& layout,
                        const compute::Backend& backend, int B, int T);
size_t ActivationGradsBytes(const GptConfig& config, const ModelLayout& layout,
                            const compute::Backend& backend, int B, int T);

// Views for (B,T) at the start of `arena` (which holds at least the Bytes
// above), in order, each starting a multiple of 256 bytes after the arena's
// start (gpt_activations.cc: so that a GPU's operands are 256-byte aligned).
GptActivations LayOutActivations(const GptConfig& config, const ModelLayout& layout,
                                 const compute::Backend& backend, compute::TensorSpan arena, int B,
                                 int T);
GptActivationGrads LayOutActivationGrads(const GptConfig& config, const ModelLayout& layout,
                                         const compute::Backend& backend,
                                         compute::TensorSpan arena, int B, int T);

}  // namespace cohort::model
