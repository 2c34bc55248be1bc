#pragma once
// GptModel: a GPT-2 style transformer (token + position embedding, pre-LN
// blocks of causal self-attention and a GELU MLP, final LayerNorm, LM head
// tied to the token embedding) whose forward and backward passes run on a
// compute::Backend. Parameters and gradients live in one flat fp32 arena
// each, laid out by ParameterTable; the optimizer works on those arenas.
//
// A step: ZeroGrad(); for each micro-batch { Forward(); Backward(scale); }
// then clip and update params() from grads(). Backward ACCUMULATES the
// gradient of (mean loss of the last Forward) * loss_scale, so with
// loss_scale = 1 / (micro_batches * dp) the accumulated gradient is that of
// the mean loss over the whole global batch.
//
// Memory: params(), grads() and logits() point into backend memory (host
// memory for CpuBackend). Activations are allocated once, for
// options.max_micro_batch sequences of config.context_length tokens.
//
// Thread-safety: thread-compatible; one caller at a time (like its Backend).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/model/gpt_activations.h"
#include "worker/model/gpt_config.h"
#include "worker/model/parameter_table.h"

namespace cohort::model {

struct ModelOptions {
  // Largest B that Forward accepts; activations are sized for it.
  int max_micro_batch = 1;
};

class GptModel {
 public:
  // A model with zeroed parameters and gradients (call InitializeParameters
  // or fill params()). `backend` must outlive the model. Errors:
  // InvalidArgument for an invalid config or max_micro_batch < 1;
  // Unimplemented for a backend whose activations are not fp32;
  // ResourceExhausted when the backend cannot allocate the arenas.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config,
                                                          compute::Backend* backend,
                                                          const ModelOptions& options);

  const GptConfig& config() const { return config_; }
  const ParameterTable& table() const { return table_; }
  size_t num_params() const { return table_.num_params(); }

  // The flat arenas (num_params() fp32 elements each, ParameterTable layout).
  float* params() { return static_cast<float*>(params_.data()); }
  const float* params() const { return static_cast<const float*>(params_.data()); }
  float* grads() { return static_cast<float*>(grads_.data()); }
  const float* grads() const { return static_cast<const float*>(grads_.data()); }
  // One tensor of either arena, or one layer's slice of a per-layer tensor.
  compute::TensorSpan param(ParamId id) const;
  compute::TensorSpan grad(ParamId id) const;
  compute::TensorSpan param(ParamId id, int layer) const;
  compute::TensorSpan grad(ParamId id, int layer) const;

  // Overwrites params() with the GPT-2 initialisation from `seed`
  // (model/parameter_init.h).
  void InitializeParameters(uint64_t seed);

  // Runs the forward pass on inputs and targets (host memory, B*T int32 each,
  // row-major (B,T)) and returns the mean cross-entropy over the B*T
  // positions. Keeps the activations for Backward and the logits for
  // logits(). Errors (nothing is computed): InvalidArgument for B outside
  // [1, max_micro_batch], T outside [1, context_length], null pointers, or a
  // token id outside [0, vocab_size) (the message names the position); and
  // any failure the backend reports.
  absl::StatusOr<double> Forward(const int32_t* inputs, const int32_t* targets, int B, int T);

  // grads()[:] = 0.
  void ZeroGrad();

  // Adds d(loss_scale * mean loss of the last Forward)/d(params) to grads().
  // May be repeated (each call adds again). FailedPrecondition without a
  // successful Forward since Create; InvalidArgument for a non-finite scale.
  absl::Status Backward(float loss_scale);

  // The logits (B,T,Vp) of the last successful Forward (backend memory); an
  // empty span before the first. Padding columns V..Vp-1 hold lnf · wte[v]
  // and take no part in the loss.
  compute::TensorSpan logits() const;
  // Copies logits() into dst (B*T*Vp floats); FailedPrecondition before the
  // first Forward.
  absl::Status CopyLogitsToHost(float* dst);
  int last_batch() const { return last_B_; }
  int last_time() const { return last_T_; }

 private:
  GptModel(const GptConfig& config, compute::Backend* backend, const ModelOptions& options);

  const GptConfig config_;
  const ParameterTable table_;
  compute::Backend* const backend_;
  const ModelOptions options_;

  compute::Buffer params_;     // num_params() fp32
  compute::Buffer grads_;      // num_params() fp32
  compute::Buffer acts_;       // ActivationsNumel(max B, maxT) fp32
  compute::Buffer grad_acts_;  // ActivationGradsNumel(max B, maxT) fp32
  compute::Buffer tokens_;     // 2 * max B * maxT int32: inputs then targets

  // State of the last successful Forward (B == 0: none yet).
  int last_B_ = 0;
  int last_T_ = 0;
  GptActivations acts_view_;
  compute::TensorSpan inputs_view_;
  compute::TensorSpan targets_view_;
  std::vector<float> host_losses_;
  std::vector<float> host_dlosses_;
};

}  // namespace cohort::model
