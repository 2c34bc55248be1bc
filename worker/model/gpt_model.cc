#include "worker/model/gpt_model.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/model/parameter_init.h"

namespace cohort::model {

using compute::DType;
using compute::TensorSpan;

GptModel::GptModel(const GptConfig& config, compute::Backend* backend, const ModelOptions& options)
    : config_(config), table_(config), backend_(backend), options_(options) {}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config,
                                                           compute::Backend* backend,
                                                           const ModelOptions& options) {
  RETURN_IF_ERROR(config.Validate());
  if (backend == nullptr) return absl::InvalidArgumentError("GptModel needs a backend");
  if (options.max_micro_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelOptions.max_micro_batch must be >= 1, got ", options.max_micro_batch));
  }
  if (backend->activation_dtype() != DType::kFloat32) {
    return absl::UnimplementedError(absl::StrCat("GptModel runs fp32 only; backend '",
                                                 std::string(backend->name()), "' computes in ",
                                                 compute::DTypeName(backend->activation_dtype())));
  }
  std::unique_ptr<GptModel> model(new GptModel(config, backend, options));
  const int max_b = options.max_micro_batch;
  const int max_t = config.context_length;
  const size_t n = model->table_.num_params();
  ASSIGN_OR_RETURN(model->params_, backend->Allocate(DType::kFloat32, n));
  ASSIGN_OR_RETURN(model->grads_, backend->Allocate(DType::kFloat32, n));
  ASSIGN_OR_RETURN(
      model->acts_,
      backend->Allocate(DType::kFloat32, ActivationsNumel(config, *backend, max_b, max_t)));
  ASSIGN_OR_RETURN(model->grad_acts_,
                   backend->Allocate(DType::kFloat32, ActivationGradsNumel(config, max_b, max_t)));
  ASSIGN_OR_RETURN(model->tokens_,
                   backend->Allocate(DType::kInt32, 2 * static_cast<size_t>(max_b) * max_t));
  return model;
}

TensorSpan GptModel::param(ParamId id) const {
  const ParameterInfo& info = table_[id];
  return params_.Slice(info.offset, info.numel);
}

TensorSpan GptModel::grad(ParamId id) const {
  const ParameterInfo& info = table_[id];
  return grads_.Slice(info.offset, info.numel);
}

TensorSpan GptModel::param(ParamId id, int layer) const {
  const ParameterInfo& info = table_[id];
  CHECK(info.per_layer && layer >= 0 && layer < config_.layers) << info.name << " layer " << layer;
  return params_.Slice(info.offset + layer * info.LayerNumel(), info.LayerNumel());
}

TensorSpan GptModel::grad(ParamId id, int layer) const {
  const ParameterInfo& info = table_[id];
  CHECK(info.per_layer && layer >= 0 && layer < config_.layers) << info.name << " layer " << layer;
  return grads_.Slice(info.offset + layer * info.LayerNumel(), info.LayerNumel());
}

void GptModel::InitializeParameters(uint64_t seed) {
  // Generate on the host, then copy: the same path for any backend.
  std::vector<float> host(num_params());
  model::InitializeParameters(config_, table_, seed, host.data());
  backend_->CopyFromHost(params_.span(), host.data());
}

absl::StatusOr<double> GptModel::Forward(const int32_t* inputs, const int32_t* targets, int B,
                                         int T) {
  if (B < 1 || B > options_.max_micro_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch size ", B, " outside [1, max_micro_batch=", options_.max_micro_batch, "]"));
  }
  if (T < 1 || T > config_.context_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length ", T, " outside [1, context_length=", config_.context_length, "]"));
  }
  if (inputs == nullptr || targets == nullptr) {
    return absl::InvalidArgumentError("Forward needs inputs and targets");
  }
  const int N = B * T;
  for (const auto& [name, ids] : {std::pair{"input", inputs}, std::pair{"target", targets}}) {
    for (int i = 0; i < N; ++i) {
      if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " token ", ids[i], " at (b=", i / T, ", t=", i % T,
                         ") outside [0, vocab_size=", config_.vocab_size, ")"));
      }
    }
  }
  // From here on the previous Forward's state is overwritten.
  last_B_ = 0;
  const int L = config_.layers;
  const int C = config_.width;
  const int NH = config_.heads;
  const int V = config_.vocab_size;
  const int Vp = config_.PaddedVocab();
  compute::Backend& be = *backend_;
  inputs_view_ = tokens_.Slice(0, N);
  targets_view_ = tokens_.Slice(N, N);
  be.CopyFromHost(inputs_view_, inputs);
  be.CopyFromHost(targets_view_, targets);
  GptActivations a = LayOutActivations(config_, be, acts_.span(), B, T);

  be.EncoderForward(a.encoded, inputs_view_, param(kWte), param(kWpe), B, T, C);
  for (int l = 0; l < L; ++l) {
    GptLayerActivations& la = a.layers[l];
    const TensorSpan residual = l == 0 ? a.encoded : a.layers[l - 1].residual3;
    be.LayerNormForward(la.ln1, la.ln1_mean, la.ln1_rstd, residual, param(kLn1w, l),
                        param(kLn1b, l), N, C);
    be.MatmulForward(la.qkv, la.ln1, param(kQkvw, l), param(kQkvb, l), N, C, 3 * C);
    be.AttentionForward(la.atty, la.att, la.qkv, B, T, C, NH);
    be.MatmulForward(la.attproj, la.atty, param(kAttprojw, l), param(kAttprojb, l), N, C, C);
    be.ResidualForward(la.residual2, residual, la.attproj, static_cast<size_t>(N) * C);
    be.LayerNormForward(la.ln2, la.ln2_mean, la.ln2_rstd, la.residual2, param(kLn2w, l),
                        param(kLn2b, l), N, C);
    be.MatmulForward(la.fch, la.ln2, param(kFcw, l), param(kFcb, l), N, C, 4 * C);
    be.GeluForward(la.fch_gelu, la.fch, static_cast<size_t>(N) * 4 * C);
    be.MatmulForward(la.fcproj, la.fch_gelu, param(kFcprojw, l), param(kFcprojb, l), N, 4 * C, C);
    be.ResidualForward(la.residual3, la.residual2, la.fcproj, static_cast<size_t>(N) * C);
  }
  be.LayerNormForward(a.lnf, a.lnf_mean, a.lnf_rstd, a.layers[L - 1].residual3, param(kLnfw),
                      param(kLnfb), N, C);
  // Tied LM head: logits = lnf wte^T over all Vp rows.
  be.MatmulForward(a.logits, a.lnf, param(kWte), TensorSpan{}, N, C, Vp);
  be.CrossEntropyForward(a.losses, a.lse, a.logits, targets_view_, N, V, Vp);

  host_losses_.resize(N);
  be.CopyToHost(host_losses_.data(), a.losses);
  RETURN_IF_ERROR(be.Synchronize());
  // Serial double sum: the same mean for any backend thread count.
  double sum = 0.0;
  for (float loss : host_losses_) sum += loss;
  acts_view_ = std::move(a);
  last_B_ = B;
  last_T_ = T;
  return sum / N;
}

void GptModel::ZeroGrad() { backend_->Zero(grads_.span()); }

absl::Status GptModel::Backward(float loss_scale) {
  if (last_B_ == 0) {
    return absl::FailedPreconditionError("Backward needs a successful Forward first");
  }
  if (!std::isfinite(loss_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("loss_scale must be finite, got ", loss_scale));
  }
  const int B = last_B_;
  const int T = last_T_;
  const int N = B * T;
  const int L = config_.layers;
  const int C = config_.width;
  const int NH = config_.heads;
  const int V = config_.vocab_size;
  const int Vp = config_.PaddedVocab();
  const size_t NC = static_cast<size_t>(N) * C;
  compute::Backend& be = *backend_;
  const GptActivations& a = acts_view_;
  const GptActivationGrads g = LayOutActivationGrads(config_, grad_acts_.span(), B, T);

  // d(loss_scale * mean loss)/d(loss at each position).
  host_dlosses_.assign(N, static_cast<float>(static_cast<double>(loss_scale) / N));
  be.CopyFromHost(a.dlosses, host_dlosses_.data());
  be.CrossEntropyBackward(g.dlogits, a.logits, a.lse, targets_view_, a.dlosses, N, V, Vp);
  // LM head; its wte gradient is the first of the two tied contributions.
  be.Zero(g.dln);
  be.MatmulBackward(g.dln, grad(kWte), TensorSpan{}, g.dlogits, a.lnf, param(kWte), N, C, Vp);
  be.Zero(g.dresidual);
  be.LayerNormBackward(g.dresidual, grad(kLnfw), grad(kLnfb), g.dln, a.layers[L - 1].residual3,
                       param(kLnfw), a.lnf_mean, a.lnf_rstd, N, C);
  // g.dresidual holds d(residual3 of layer l) entering each iteration and
  // d(input residual of layer l) leaving it: the residual adds pass their
  // gradient through unchanged, so the branches only add into it.
  for (int l = L - 1; l >= 0; --l) {
    const GptLayerActivations& la = a.layers[l];
    const TensorSpan residual = l == 0 ? a.encoded : a.layers[l - 1].residual3;
    // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
    be.Zero(g.dfch_gelu);
    be.MatmulBackward(g.dfch_gelu, grad(kFcprojw, l), grad(kFcprojb, l), g.dresidual, la.fch_gelu,
                      param(kFcprojw, l), N, 4 * C, C);
    be.Zero(g.dfch);
    be.GeluBackward(g.dfch, la.fch, g.dfch_gelu, NC * 4);
    be.Zero(g.dln);
    be.MatmulBackward(g.dln, grad(kFcw, l), grad(kFcb, l), g.dfch, la.ln2, param(kFcw, l), N, C,
                      4 * C);
    be.LayerNormBackward(g.dresidual, grad(kLn2w, l), grad(kLn2b, l), g.dln, la.residual2,
                         param(kLn2w, l), la.ln2_mean, la.ln2_rstd, N, C);
    // Attention branch: residual2 = residual + attproj(attention(qkv(ln1(residual)))).
    be.Zero(g.datty);
    be.MatmulBackward(g.datty, grad(kAttprojw, l), grad(kAttprojb, l), g.dresidual, la.atty,
                      param(kAttprojw, l), N, C, C);
    be.Zero(g.dqkv);
    be.AttentionBackward(g.dqkv, g.datty, la.qkv, la.att, B, T, C, NH);
    be.Zero(g.dln);
    be.MatmulBackward(g.dln, grad(kQkvw, l), grad(kQkvb, l), g.dqkv, la.ln1, param(kQkvw, l), N, C,
                      3 * C);
    be.LayerNormBackward(g.dresidual, grad(kLn1w, l), grad(kLn1b, l), g.dln, residual,
                         param(kLn1w, l), la.ln1_mean, la.ln1_rstd, N, C);
  }
  // The embedding's wte gradient is the second tied contribution.
  be.EncoderBackward(grad(kWte), grad(kWpe), g.dresidual, inputs_view_, B, T, C);
  return be.Synchronize();
}

TensorSpan GptModel::logits() const {
  if (last_B_ == 0) return TensorSpan{};
  return acts_view_.logits;
}

absl::Status GptModel::CopyLogitsToHost(float* dst) {
  if (last_B_ == 0) return absl::FailedPreconditionError("no Forward has run yet");
  backend_->CopyToHost(dst, acts_view_.logits);
  return backend_->Synchronize();
}

}  // namespace cohort::model
